"""`vc-attention demo`: every VC-Attention mode on a built-in video-like attention sample.

The command line only; the measurement is in demo_modes.py (imported when the command runs, so
`vc-attention --help` does not load torch). The plot goes where --out says, by default into the
system's temporary folder: the demo never writes into the current folder (often the checkout).
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

HELP = "Run every VC-Attention mode on a built-in video-like sample; print a table and write a PNG plot."

SIZES = ("gpu", "cpu", "tiny")  # demo_modes.SAMPLE_SIZES


def default_out() -> Path:
    return Path(tempfile.gettempdir()) / "vc-attention" / "vc_attention_demo.png"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: cuda when a GPU is visible, else cpu (reference emulation, fidelity only).")
    parser.add_argument("--size", choices=SIZES, default=None,
                        help="sample size (default: gpu on CUDA, cpu on CPU; tiny is for tests).")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where to write the PNG plot (default: {default_out()}).")
    parser.add_argument("--repeats", type=int, default=20, help="timed repetitions per mode on a GPU.")


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise ValueError("--repeats must be at least 1.")
    from . import demo_modes

    return demo_modes.run(args, (args.out or default_out()).resolve())
