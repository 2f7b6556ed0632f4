"""Builds every build-time variant of the portable kernel (kernels/mma_variants.py) into the JIT cache,
several at once, so that the GPU tier's variant suite (tests/test_mma_variants_gpu.py) finds them built.

Built one after another inside pytest they took ~350 of a device call's 600 s on a fresh machine (14
builds then, 16 now, ~25 s each; each build's few sources keep only 3-4 of the 16 cores busy).

    python3 bench/build_mma_variants.py [--jobs 4] [--only NAME,NAME+-DFLAG=1,...]

--only builds just those (bench/mma_variants.py's names: a registered variant, '+'-separated -D flags after it), so a
timing stage finds its builds made in parallel instead of one after another inside the timing script.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import time


def build(name: str) -> tuple[str, float]:
    from vc_attention.bench.mma_variants import variant_flags
    from vc_attention.kernels import backend_mma

    start = time.perf_counter()
    backend_mma.extension(variant_flags(name))
    return name, time.perf_counter() - start


def main() -> None:
    from vc_attention.kernels import mma_variants

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4, help="builds at once (each is its own process)")
    parser.add_argument("--only", default="", help="comma-separated names to build instead of every registered variant")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(mma_variants.VARIANTS)
    start = time.perf_counter()
    # processes, not threads: each build holds its own cache directory's lock and the import state
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for name, seconds in pool.map(build, names):
            print(f"{name}: {seconds:.0f} s", flush=True)
    print(f"built {len(names)} variants in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
