"""`vc-attention` console script: dispatches to one module per subcommand in `commands/`.

Each subcommand module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`.
Every module is imported to build the parser (`--help` included), so a module's top level must not
import torch or the kernels (`--help` answers in well under a second); optional dependencies
(matplotlib, sageattention, safetensors) are imported inside the functions that use them, so a
missing one only affects the command that needs it. A command that cannot run here raises a
one-sentence error with its remedy; `main` prints it without a traceback and returns 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .commands.errors import EXIT_USAGE, CommandError

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


def _is_readable(err: Exception) -> bool:
    """Errors written as one sentence with a remedy (printed as they are, no traceback)."""
    if isinstance(err, (CommandError, ValueError)):
        return True
    jit = sys.modules.get(f"{__package__}.kernels.jit")  # loaded only if a command used the JIT
    return jit is not None and isinstance(err, jit.JitError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    mod = importlib.import_module(f"{__package__}.commands.{SUBCOMMANDS[args.command]}")
    try:
        return int(mod.run(args) or 0)
    except Exception as err:
        if not _is_readable(err):
            raise
        print(f"vc-attention {args.command}: {err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
