"""Multi-GPU end-to-end benchmark: Wan 14B (diffusers, random weights) with Ulysses context parallel.

One forward of WanTransformer3DModel at the Wan2.1/2.2-T2V-14B widths (commands/bench_e2e.py) and
720p / 81 frames by default, on 1 GPU and on `gpus` GPUs (ContextParallelConfig(ulysses_degree=gpus)),
with diffusers' native attention and with our registered backend. The work runs in
commands/cp_worker.py under torchrun (NCCL, NVLink multicast off: NCCL_NVLS_ENABLE=0); rank 0's
numbers become the rows:

    {method, gpus, forward_ms, x_1gpu, x_native_2gpu, rel_l2, grouping_forward_ms, layers, tokens, ...}

x_1gpu: the same method on 1 GPU divided by this row (the parallel speed-up; the target for our
backend on 2 GPUs is >= 1.8). x_native_2gpu: native attention on `gpus` GPUs divided by this row.
rel_l2: the output against native attention on 1 GPU.

    python -m vc_attention.commands.bench_multigpu --gpus 2     # prints the rows as JSON
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run_cp_worker(nproc: int, worker_args: list[str], timeout: float = 1800) -> list[dict]:
    """Launch commands/cp_worker.py on `nproc` processes; returns each rank's result (rank order).

    The child processes see this process's import path, so the package is found however it was
    imported here (installed, PYTHONPATH, a checkout)."""
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               "-m", f"{__package__}.cp_worker", "--out", out, *worker_args]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"the context-parallel worker failed (exit {done.returncode}): {done.stderr[-4000:]}")
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(nproc)]


def rows_from_result(result: dict, mode: str, layers: int) -> list[dict]:
    """Benchmark rows from one rank's worker result (see the module docstring)."""
    runs = {(r["method"], r["gpus"]): r for r in result["runs"]}
    world = result["world"]
    native_parallel = runs[("native", world)]["forward_ms"]
    rows = []
    for (method, gpus), run in runs.items():
        rows.append({
            "method": "native" if method == "native" else f"vc-{mode}",
            "gpus": gpus,
            "forward_ms": run["forward_ms"],
            "x_1gpu": runs[(method, 1)]["forward_ms"] / run["forward_ms"],
            "x_native_2gpu": native_parallel / run["forward_ms"],
            "rel_l2": run["rel_l2_vs_native_1gpu"],
            "grouping_forward_ms": run["grouping_forward_ms"],
            "layers": layers,
            "tokens": result["tokens"],
            "kernels": sorted(result["kernel_calls"]) if method == "vc" else [],
        })
    return rows


def multigpu_rows(gpus: int = 2, layers: int = 40, frames: int = 81, height: int = 720, width: int = 1280,
                  mode: str = "balanced", repeats: int = 2) -> list[dict]:
    """Time the Wan 14B forward on 1 and `gpus` GPUs, native attention and ours; rows of rank 0."""
    args = ["--device", "cuda", "--model", "wan14b", "--layers", str(layers), "--frames", str(frames),
            "--height", str(height), "--width", str(width), "--text-tokens", "512", "--mode", mode,
            "--repeats", str(repeats)]
    results = run_cp_worker(gpus, args)
    return rows_from_result(results[0], mode, layers)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Wan 14B forward on 1 vs N GPUs (Ulysses), native vs VC-Attention.")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--mode", default="balanced")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    rows = multigpu_rows(args.gpus, args.layers, args.frames, args.height, args.width, args.mode, args.repeats)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
