"""`vc-attention` console script: dispatches to one module per subcommand in `commands/`.

Each subcommand module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`.
Every module is imported to build the parser (`--help` included), so a module's top level should
import only what its arguments need; optional dependencies (matplotlib, sageattention, safetensors)
are imported inside the functions that use them, so a missing one only affects the command that
needs it.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module in .commands (kept in the order `--help` shows them)
SUBCOMMANDS = {
    "fidelity": "fidelity",
    "demo": "demo",
    "build": "build",
    "doctor": "doctor",
    "bench": "bench",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vc-attention", description="VC-Attention: low-bit video attention tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in SUBCOMMANDS.items():
        mod = importlib.import_module(f"{__package__}.commands.{module}")
        mod.add_arguments(sub.add_parser(name, help=mod.HELP, description=mod.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    mod = importlib.import_module(f"{__package__}.commands.{SUBCOMMANDS[args.command]}")
    return int(mod.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
