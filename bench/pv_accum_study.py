"""Would an fp16-accumulated PV partial (mma.sync ...f16.e4m3.e4m3.f16, folded into fp32 per step)
keep our accuracy? CPU emulation on video-like data, to judge the option before writing it.

Why the option: GeForce Ada / Blackwell run FP8 MMAs with fp16 accumulation at twice the fp32 rate
(SageAttention 2.2's "fp32+fp16"). Why it is not free here: P reaches 256 (row max -> 2^8) and V
residual codes reach 448, so ONE product (114688) already overflows fp16 (65504). The emulation
therefore also tries V codes re-quantized at 2^-8 of their scale (max 1.75: a 64-key partial is at
most 256 * 64 * 1.75 = 28672), which only loses precision for codes below 2^-6 * 2^8 = 4 (values
under 1% of the channel amax).

For sampled query rows against ALL keys (V-Smooth, k-means order, INT8 QK as the reference does),
the online softmax is emulated per `step` keys with its running max offsets, and the PV partial
of every step is summed as:
- fp32: exactly (what the kernels do today, up to fp32 summation order) = the reference;
- fp16: rounded to fp16 after each 32-key MMA (the accumulator register is fp16), V codes as is;
- fp16-v/256: the same with V codes re-quantized to E4M3 at 2^-8 (scale x256 in the epilogue).
Reported: rel-L2 vs fp64 exact attention, vs the fp32 path, and the fraction of non-finite outputs.

    python3 bench/pv_accum_study.py                       # N = 4096 and 32760, 256 rows x 2 heads
    python3 bench/pv_accum_study.py --sizes 4096 --rows 64
"""
from __future__ import annotations

import argparse
import math

import torch

from vc_attention.study import fidelity
from vc_attention.kernels import reference as ref
from vc_attention.study import videodata
from vc_attention.kernels.config import FIDELITY as FIDELITY_PRESET, SPEED, VCConfig

# the study's fidelity mode: exp2 P without the preset's refinements (the portable kernel's fidelity, whose PV
# accumulation this studies; its encoders are reference.P_ENCODERS')
FIDELITY = FIDELITY_PRESET.without_refinements()
from vc_attention.kernels.grouping import DEFAULT_ITERS

GRIDS = {1024: (1, 32, 32), 4096: (2, 32, 64), 32760: (21, 30, 52)}
MMA_KEYS = 32  # keys per m16n8k32 MMA: the fp16 accumulator is rounded after each
ACCUMULATIONS = ("fp32", "fp16", "fp16-v/256")
V_SHIFT = 2.0**-8


def video_case(n: int, heads: int, rows: int, seed: int) -> dict:
    """Scores (log2, as the kernel sees them) of sampled rows, V-Smooth operands, exact outputs."""
    t, hg, wg = GRIDS[n]
    q, k, v = videodata.video_like_qkv(B=1, H=heads, T=t, Hgrid=hg, Wgrid=wg, seed=seed, dtype=torch.bfloat16)
    perm = fidelity.grouping_permutation(v, fidelity.default_clusters(n), DEFAULT_ITERS, seed)
    kp, vp = ref.permute_tokens(k, perm), ref.permute_tokens(v, perm)
    q_q, q_sc, k_q, k_sc = ref.quantize_qk(q, kp, FIDELITY)
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: min(rows, n)].sort().values
    # the reference's score arithmetic, restricted to the sampled rows (one Q scale per row)
    acc = torch.matmul(q_q[:, :, idx].float(), k_q.float().transpose(-1, -2))
    scores = acc * (q_sc[:, :, idx].unsqueeze(-1) * ref.expand_rows(k_sc, ref.K_BLOCK, n).transpose(-1, -2))
    logits = q[:, :, idx].double() @ kp.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    return {"scores": scores, "vsmooth": ref.quantize_v_vsmooth(vp), "exact": torch.softmax(logits, -1) @ vp.double()}


def pv_output(scores: torch.Tensor, vs: ref.VSmoothV, config: VCConfig, accumulation: str, step: int = 64) -> torch.Tensor:
    """Attention output (float64) of the online softmax in `step`-key steps with the PV partial of
    each step accumulated as `accumulation` (one of ACCUMULATIONS), then folded in float."""
    if accumulation not in ACCUMULATIONS:
        raise ValueError(f"accumulation must be one of {ACCUMULATIONS}, got {accumulation!r}.")
    if step % MMA_KEYS:
        raise ValueError(f"step must be a multiple of {MMA_KEYS} keys.")
    n = scores.shape[-1]
    n_pad = -(-n // ref.K_BLOCK) * ref.K_BLOCK
    run = ref.running_row_offsets(scores, step)                        # (..., rows, steps)
    p = ref.P_ENCODERS[config.p](scores, run.repeat_interleave(step, dim=-1)[..., :n])  # float32 values
    p = torch.nn.functional.pad(p, (0, n_pad - n))
    codes = torch.nn.functional.pad(vs.residual_q, (0, 0, 0, n_pad - n))  # (B,H,n_pad,D) code values
    if accumulation == "fp16-v/256":
        codes = ref.fp8_e4m3(codes * V_SHIFT)
    b, h, rows, _ = p.shape
    d = codes.shape[-1]
    # exact 32-key partial sums (products of E4M3 values are exact in float32; 32-term sums nearly)
    mma = torch.einsum("bhrkc,bhkcd->bhrkd", p.view(b, h, rows, -1, MMA_KEYS), codes.view(b, h, -1, MMA_KEYS, d))
    per_step = mma.view(b, h, rows, -1, step // MMA_KEYS, d)
    if accumulation == "fp32":
        partial = per_step.double().sum(dim=4)
    else:
        acc16 = torch.zeros_like(per_step[:, :, :, :, 0]).half()
        for i in range(step // MMA_KEYS):  # the fp16 register after each MMA
            acc16 = (acc16.float() + per_step[:, :, :, :, i]).half()
        partial = acc16.double() / (V_SHIFT if accumulation == "fp16-v/256" else 1.0)
    l_step = p.double().view(b, h, rows, -1, step).sum(-1)              # ones column, fp32-exact
    mu = ref.expand_rows(vs.mean.double(), ref.V_BLOCK, n_pad)[:, :, ::step]  # (B,H,steps,D)
    alpha = torch.exp2(run.double() - run[..., -1:].double())            # (..., rows, steps)
    o = (alpha.unsqueeze(-1) * (partial * vs.scale.double().unsqueeze(2) + l_step.unsqueeze(-1) * mu.unsqueeze(2))).sum(3)
    return o / (alpha * l_step).sum(-1, keepdim=True)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    finite = torch.isfinite(a)
    if not bool(finite.all()):
        return math.inf
    return float((a - b).norm() / b.norm())


def study(sizes, heads: int, rows: int, seed: int) -> list[dict]:
    results = []
    for n in sizes:
        case = video_case(n, heads, rows, seed)
        for mode, config in (("fidelity", FIDELITY), ("speed", SPEED)):
            base = pv_output(case["scores"], case["vsmooth"], config, "fp32")
            for accumulation in ACCUMULATIONS:
                out = base if accumulation == "fp32" else pv_output(case["scores"], case["vsmooth"], config, accumulation)
                results.append(dict(n=n, mode=mode, accumulation=accumulation, vs_exact=rel_l2(out, case["exact"]),
                                    vs_fp32=rel_l2(out, base), nonfinite=float((~torch.isfinite(out)).double().mean())))
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 32760], choices=sorted(GRIDS))
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=256, help="query rows sampled per head")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    print(f"{'N':>6s} {'mode':9s} {'PV partial':11s} {'vs exact':>9s} {'vs fp32':>9s} {'non-finite':>10s}")
    for r in study(args.sizes, args.heads, args.rows, args.seed):
        print(f"{r['n']:6d} {r['mode']:9s} {r['accumulation']:11s} {r['vs_exact']:9.5f} {r['vs_fp32']:9.2e} {r['nonfinite']:10.4f}", flush=True)


if __name__ == "__main__":
    main()
