"""`vc-attention build`: pre-build the CUDA extensions (the same JIT build as first use)."""
from __future__ import annotations

import argparse
import os

HELP = "Pre-build the CUDA kernels for this GPU (or --arch) into the JIT cache."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", help="target arch such as 9.0a, 8.9 or 12.0a (default: the current GPU's)")
    parser.add_argument("--verbose", action="store_true", help="show compiler commands and ptxas register/spill reports")


def run(args: argparse.Namespace) -> int:
    from ..kernels import jit

    if args.arch:
        os.environ[jit.ENV_PREFIX + "ARCH"] = args.arch
    if args.verbose:
        os.environ[jit.ENV_PREFIX + "VERBOSE"] = "1"
    arch = jit.target_arch()
    from ..kernels import backend_mma, grouping_fused, prepare_cuda

    prepare_cuda.extension()
    backend_mma.extension()
    print(f"prepare and mma kernels ready for sm_{jit.arch_code(arch)} (cache: {jit.cache_root()})")
    grouping_fused.extension()
    print(f"grouping kernels ready for sm_{jit.arch_code(arch)}")
    if arch == "9.0a":
        from ..kernels import backend_sm90

        backend_sm90.extension()
        print(f"sm90 kernels ready (cache: {jit.cache_root()})")
    return 0
