"""`vc-attention build`: pre-build the CUDA extensions (the same JIT build as first use)."""
from __future__ import annotations

import argparse
import concurrent.futures
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

    builds = {"prepare": prepare_cuda.extension, "mma": backend_mma.extension, "grouping": grouping_fused.extension}
    if arch == "9.0a":
        from ..kernels import backend_sm90

        builds["sm90"] = backend_sm90.extension
    # one nvcc/ninja job per extension at once: each is a handful of translation units, so building them
    # side by side takes about as long as the slowest one instead of their sum (99 s -> 31 s on the H200)
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(builds)) as pool:
        futures = {pool.submit(build): name for name, build in builds.items()}
        for future in concurrent.futures.as_completed(futures):
            try:
                future.result()
            except jit.JitError as err:  # every failed build is reported, with the compiler's message
                failed.append(futures[future])
                print(f"{futures[future]} kernels FAILED to build for sm_{jit.arch_code(arch)}:\n{err}")
            else:
                print(f"{futures[future]} kernels ready for sm_{jit.arch_code(arch)}")
    if failed:
        print(f"vc-attention build: {len(failed)} of {len(builds)} extensions failed ({', '.join(sorted(failed))})")
        return 1
    print(f"all kernels built (cache: {jit.cache_root()})")
    return 0
