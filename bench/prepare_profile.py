"""Where a fused prepare call's GPU time goes: every kernel one call launches, with its duration.

  python3 bench/prepare_profile.py [--shapes wan21-1.3b-480p,wan22-14b-720p] [--mode fidelity] [--ncu]
  python3 bench/prepare_profile.py --grouping 64x1 [--batch 2] [--grouping-build order-direct]   # a grouping call

Per shape (random bf16, (B,H,N,D), a random permutation, as bench/prepare_variants.py): the call timed
with CUDA events (median of 20 after a warm-up), then one call under torch.profiler (CUPTI kernel
records: the workspace zeroing, the permutation's dtype cast, both prepare kernels), printed as a
table of kernel name and microseconds and their sum against the call's event time (the difference is
launch gaps). --grouping CxI: the same for one grouping call (kernels.grouping.group_tokens, C
clusters, I iterations, a cold start as the first step of the grouping window) and the cached
grouping's permutation (the reuse steps' call); --grouping-build: one of grouping_fused.VARIANTS. --batch: the shapes' batch (2: CFG batched). --ncu: the script only runs one warmed-up call between cudaProfilerStart/Stop, for
`ncu --profile-from-start off ...` (DRAM throughput, occupancy of each kernel). Writes
prepare_profile.json to $OUT (default bench/results).
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from vc_attention.commands.bench import SHAPES, cuda_time_ms
from vc_attention.kernels import prepare_cuda as prep
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT, SPEED

MODES = {"fidelity": FIDELITY, "speed": SPEED, "plain8": PLAIN_8BIT}


def inputs(shape: str, batch: int = 0):
    b, h, n, d = SHAPES[shape]
    b = batch or b
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=gen, device="cuda") for _ in range(3))
    v = v + 2.0 * torch.randn(d, generator=gen, device="cuda")
    perm = torch.argsort(torch.rand(b, h, n, device="cuda", generator=gen), dim=-1).to(torch.int32)
    return [t.to(torch.bfloat16) for t in (q, k, v)] + [perm]


def kernel_table(call) -> list[tuple[str, float]]:
    """(kernel name, microseconds) of every GPU kernel or memset one call launches, in launch order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    rows = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            rows.append((event.name, event.device_time))
    return rows


def profile_call(shape: str, label: str, call, ncu: bool, bhnd) -> list[dict]:
    """Event time and kernel table of one call (empty with ncu: the profiler range only)."""
    call()
    torch.cuda.synchronize()
    if ncu:
        torch.cuda.cudart().cudaProfilerStart()
        call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        return []
    ms = cuda_time_ms(call, reps=20)
    table = kernel_table(call)
    total_us = sum(us for _, us in table)
    print(f"{shape} {tuple(bhnd)} {label}: call {ms * 1e3:.1f} us (events), kernels {total_us:.1f} us")
    for name, us in table:
        print(f"  {us:9.1f} us  {name[:110]}")
    return [{"shape": shape, "bhnd": list(bhnd), "call": label, "call_us": ms * 1e3, "kernels_us": total_us,
             "kernels": [{"name": name, "us": us} for name, us in table]}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="wan21-1.3b-480p,wan22-14b-720p")
    parser.add_argument("--mode", default="fidelity", choices=sorted(MODES))
    parser.add_argument("--ncu", action="store_true", help="one call between cudaProfilerStart/Stop only")
    parser.add_argument("--grouping", default=None, help="CLUSTERSxITERS: profile a grouping call instead")
    parser.add_argument("--batch", type=int, default=0, help="batch size (default: the shape's)")
    parser.add_argument("--grouping-build", default="default",
                        help="a build of kernels.grouping_fused.VARIANTS for --grouping (e.g. order-direct)")
    args = parser.parse_args()
    config = MODES[args.mode]
    results = []
    for shape in args.shapes.split(","):
        q, k, v, perm = inputs(shape, args.batch)
        calls = {args.mode: lambda: prep.prepare_cuda(q, k, v, perm, config)}
        if args.grouping:
            from vc_attention.kernels import grouping_fused
            from vc_attention.kernels.grouping import group_tokens

            grouping_fused.BUILD = args.grouping_build  # the tool's own process: the build it profiles

            clusters, iters = (int(x) for x in args.grouping.split("x"))
            cached = group_tokens(v, clusters, iters)
            cached.perm()  # hands out the fresh permutation: later perm() calls sort the labels (reuse steps)
            calls = {f"grouping {args.grouping}": lambda: group_tokens(v, clusters, iters).perm(),
                     "cached perm": lambda: cached.perm(v)}  # v: the within-cluster bins, when on
        for label, call in calls.items():
            results += profile_call(shape, label, call, args.ncu, q.shape)
    if results:
        env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
               "command": "python3 bench/prepare_profile.py --shapes " + args.shapes + (
                   f" --grouping {args.grouping} --grouping-build {args.grouping_build}" if args.grouping
                   else f" --mode {args.mode}") + (
                   f" --batch {args.batch}" if args.batch else "")}
        out = Path(os.environ.get("OUT", "bench/results"), "prepare_profile.json")
        out.write_text(json.dumps({"env": env, "rows": results}, indent=1))


if __name__ == "__main__":
    main()
