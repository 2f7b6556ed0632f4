"""Does a balanced rounding of V-Smooth's FP8 residual lower the V term? (emulated, CPU; docs/kernel-notes.md 31)

The V term ||P_q (V - V_q)|| / ||O|| is the larger error term of fidelity mode. If P were nearly flat inside each
128-key block, most of it would be the block sum of the rounding errors, which a rounding that flips the fewest
near-tie elements per (block, channel) could drive to ~0 at no kernel cost (the prepare chooses the codes, the
attention kernels are unchanged). This measures it with the study's spec quantizers (bench/fidelity_study.py):
exact-rounding residual ("channel", the spec) against the per-block-x-channel scale and balanced rounding over
blocks of 128 / 64 / 32 / 16 rows, on the video-like data.

    python3 bench/v_rounding_study.py --size 32760 --seeds 0
"""
from __future__ import annotations

import argparse
import time

import torch

from vc_attention.bench import fidelity_study as fs
from vc_attention.kernels import reference as ref

F8 = torch.float8_e4m3fn


def fp8_neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The round-to-nearest E4M3 value of x and the E4M3 value on x's other side (x itself where exact)."""
    q8 = x.to(F8)
    q = q8.float()
    c = q8.view(torch.uint8).to(torch.int32)
    neg, mag = c >= 128, c & 127
    up = torch.where(neg & (mag == 0), torch.ones_like(c), (c & 128) | torch.where(neg, mag - 1, mag + 1).clamp(0, 126))
    dn = torch.where(~neg & (mag == 0), torch.full_like(c, 129), (c & 128) | torch.where(neg, mag + 1, mag - 1).clamp(0, 126))
    alt = torch.where(q >= x, dn.to(torch.uint8).view(F8).float(), up.to(torch.uint8).view(F8).float())
    return q, torch.where(q == x, q, alt)


def fewest_flips(x: torch.Tensor, q: torch.Tensor, alt: torch.Tensor, weight: torch.Tensor, dim: int) -> torch.Tensor:
    """q with some elements switched to alt (each x's other rounding neighbour) along `dim`, so that the weighted sum of
    the rounding errors, sum(weight * (result - x)), comes closest to zero: the switches that add the least error per
    unit of correction first (greedy), as many as help. The study tools' shared rounding rule (this file's balanced V
    rounding, bench/qk_term_study.py's K codes orthogonal to a direction)."""
    err_sum = ((q - x) * weight).sum(dim, keepdim=True)
    delta = (alt - q) * weight
    cost = (alt - x).abs() - (q - x).abs()
    useful = (delta * err_sum < 0) & (alt != q)
    order = torch.where(useful, cost / delta.abs().clamp_min(1e-30), torch.full_like(cost, float("inf"))).argsort(dim=dim)
    steps = torch.where(useful, delta, torch.zeros_like(delta)).gather(dim, order)
    best = (err_sum + torch.cat([torch.zeros_like(err_sum), steps.cumsum(dim)], dim)).abs().argmin(dim, keepdim=True)
    positions = torch.arange(x.shape[dim], device=x.device).view([-1 if i == dim % x.dim() else 1 for i in range(x.dim())])
    rank = torch.empty_like(order).scatter_(dim, order, positions.expand_as(order))
    return torch.where(useful & (rank < best), alt, q)


def balanced_fp8(x: torch.Tensor, block: int) -> torch.Tensor:
    """E4M3 values of x (B,H,N,D, already scaled) with the fewest near-tie flips per (block, channel) that bring the
    block's sum of rounding errors closest to zero."""
    b, h, n, d = x.shape
    xb = ref.pad_rows(x, block).reshape(b, h, -1, block, d)
    q, alt = fp8_neighbours(xb)
    return fewest_flips(xb, q, alt, torch.ones_like(xb), dim=3).reshape(b, h, -1, d)[:, :, :n]


def v_hat_balanced(v_perm: torch.Tensor, block: int) -> torch.Tensor:
    """fidelity mode's V (128-row fp16 means, per-channel residual scale) with the residual rounded by balanced_fp8."""
    n = v_perm.shape[-2]
    mean = ref.expand_rows(ref.vsmooth_means(v_perm).float(), ref.V_BLOCK, n)
    resid = v_perm.float() - mean
    amax = ref.channel_absmax(resid)
    inv = torch.where(amax > 0, ref.E4M3_MAX / amax, torch.zeros_like(amax))
    return balanced_fp8(resid * inv, block) * (amax / ref.E4M3_MAX) + mean


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32760, choices=sorted(fs.GRIDS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--heads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    blocks = (128, 64, 32, 16)
    print("| seed | V rounding | rel-L2 | QK term | V term |\n|---|---|---|---|---|")
    for seed in args.seeds:
        start = time.time()
        case = fs.make_case("video", args.size, args.heads, args.rows, seed, fs.Grouping(64, 2, "chain"))
        for blk in blocks:
            case.v_hat[f"bal{blk}"] = v_hat_balanced(case.v_perm, blk).float()
        labels = {"channel": "nearest (the spec)", "block": "nearest, scale per block x channel",
                  **{f"bal{b}": f"balanced per {b} rows" for b in blocks}}
        for key, label in labels.items():
            r = fs.measure(case, fs.Knobs(p="exp2", v_scale=key))
            print(f"| {seed} | {label} | {r['rel_l2']:.5f} | {r['qk_term']:.5f} | {r['v_term']:.5f} |", flush=True)
        print(f"(N = {args.size}, seed {seed}: {time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
