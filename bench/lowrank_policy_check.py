"""The fast basis policy (kernels/lowrank_policy.py) against the spec's (reference.lowrank_basis) on the
video-like data: V's relative error after V-Smooth with each rank-6 basis (what the basis is for), the
smallest and mean cosine of the principal angles between the two subspaces, and the time of each.

  python3 bench/lowrank_policy_check.py [--device cuda] [--seeds 0 1] [--iters 4 8 12]
"""
from __future__ import annotations

import argparse
import time

import torch

from vc_attention.kernels import grouping
from vc_attention.kernels import reference as R
from vc_attention.kernels.lowrank_policy import lowrank_basis_fast
from vc_attention.study.videodata import video_like_qkv


def _timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--iters", type=int, nargs="+", default=[4, 8, 12])
    parser.add_argument("--rank", type=int, default=6)
    args = parser.parse_args()
    for seed in args.seeds:
        _, _, v = video_like_qkv(B=1, H=2, T=21, Hgrid=30, Wgrid=52, D=128, dtype=torch.bfloat16, seed=seed,
                                 device=args.device)
        v_perm = R.permute_tokens(v, grouping.group_tokens(v, 64, 2).perm())
        spec, spec_ms = _timed(lambda: R.lowrank_basis(v_perm, args.rank))

        def v_error(basis):
            return float((R.quantize_v_vsmooth(v_perm, basis).dequantized() - v_perm.float()).norm() / v_perm.float().norm())

        print(f"seed {seed}: V error rank 0 {v_error(None):.5f}, spec basis {v_error(spec):.5f} ({spec_ms:.0f} ms)")
        for iters in args.iters:
            fast, fast_ms = _timed(lambda: lowrank_basis_fast(v_perm, args.rank, iters=iters))
            cos = torch.linalg.svdvals(spec.double() @ fast.double().transpose(-1, -2))
            print(f"  fast, {iters} iterations: V error {v_error(fast):.5f} ({fast_ms:.0f} ms), principal-angle cosine "
                  f"min {cos.min():.4f} mean {cos.mean():.4f}")


if __name__ == "__main__":
    main()
