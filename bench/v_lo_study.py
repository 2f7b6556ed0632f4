"""The V-Smooth residual's second E4M3 term (VCConfig.v_lo_channels), emulated on CPU: how much of the V term goes.

The V term (the residual's E4M3 rounding) is the larger part of fidelity mode's error. reference.quantize_v_vsmooth with
lo_channels keeps, on that many channels per head, the first term's rounding error as a second E4M3 term of the same
scale. This measures it on the video-like data with fidelity mode's quantizers (Q per row, K per 256 keys, the exact
running max over 256-key steps, exp2 + cast) and the fidelity preset's clusters (128 x 1, chain ids), against float64
exact attention: rel-L2 of the bf16 output, mean over the seeds; the channels chosen by the spec's policy (residual
energy) or by the channel amax (what a prepare's statistics pass already has); and the combination with the mixed P
encoding (p="mixed", bench/mixed_encoding_study.py).

    python3 bench/v_lo_study.py --sizes 32760 75600 --seeds 0 1
"""
from __future__ import annotations

import torch

from vc_attention.bench import fidelity_study as fs
from vc_attention.bench.mixed_encoding_study import print_table, sweep
from vc_attention.kernels import reference as ref
from vc_attention.kernels.config import FIDELITY

STEP = 256  # keys per online-softmax step of the Hopper fidelity loop at head dim 128
COUNTS = (0, 8, 16, 32, 128)  # 8 and 128 (every channel) are emulation-only: the kernels' MMA widths are 16 and 32


def scores(case: fs.Case) -> tuple[torch.Tensor, torch.Tensor]:
    """The integer scores and their scales of fidelity mode (reference.scores_log2's order)."""
    qs = case.q.float() * torch.tensor(ref.qk_scale(case.q.shape[-1], None), dtype=torch.float32)
    q_q, q_sc = fs.int8_rows(qs, "1")
    k_q, k_sc = fs.int8_rows(ref.smooth_k(case.k_perm)[0], str(FIDELITY.k_scale_rows))
    return torch.matmul(q_q[:, :, case.rows], k_q.transpose(-1, -2)), q_sc[:, :, case.rows] * k_sc.transpose(-1, -2)


def rel_l2(case: fs.Case, p: torch.Tensor, v_hat: torch.Tensor) -> float:
    p = p / p.sum(-1, keepdim=True)
    out = (p.float() @ v_hat.float()).double()
    return ((out.bfloat16().double() - case.exact).norm() / case.exact.norm()).item()


def amax_channels(v_perm: torch.Tensor, count: int) -> torch.Tensor:
    """The `count` channels with the largest residual amax (stable ties), ascending."""
    mean = ref.vsmooth_means(v_perm)
    amax = ref.channel_absmax(v_perm.float() - ref.expand_rows(mean.float(), ref.V_BLOCK, v_perm.shape[-2])).squeeze(-2)
    return torch.sort(-amax.double(), dim=-1, stable=True).indices[..., :count].sort(dim=-1).values


def case_rows(case: fs.Case) -> dict[str, float]:
    acc, sc = scores(case)
    s = acc * sc
    p_exp2 = ref.quantize_p(s, FIDELITY, STEP)
    p_mixed = ref.quantize_p(s, FIDELITY.with_(p="mixed"), STEP, acc=acc.to(torch.int64), scale=sc)
    # every key by the chord (mixed at 8/8: the speed encoding inside fidelity's loop, means and K scales)
    p_chord = ref.quantize_p(s, FIDELITY.with_(p="mixed"), STEP, acc=acc.to(torch.int64), scale=sc, chord_eighths=8)
    rows = {}
    for count in COUNTS:
        v_hat = ref.quantize_v_vsmooth(case.v_perm, lo_channels=count).dequantized()
        rows[f"exp2, second term on {count} channels (residual energy)"] = rel_l2(case, p_exp2, v_hat)
        if count in (16, 32):
            by_amax = ref.quantize_v_vsmooth(case.v_perm, lo_channels=count,
                                             lo_sel=amax_channels(case.v_perm, count)).dequantized()
            rows[f"exp2, second term on {count} channels (channel amax)"] = rel_l2(case, p_exp2, by_amax)
        if count in (0, 16, 32):
            rows[f"mixed (chord 4/8), second term on {count} channels"] = rel_l2(case, p_mixed, v_hat)
        if count in (0, 32):
            rows[f"chord for every key (8/8), second term on {count} channels"] = rel_l2(case, p_chord, v_hat)
    return rows


def main(argv=None) -> None:
    means, args = sweep(case_rows, argv, [0, 1], __doc__.splitlines()[0])
    print(f"\nrel-L2 of the bf16 output vs float64 (video-like data, {args.rows} rows x {args.heads} heads, mean of seeds "
          f"{args.seeds}; fidelity's quantizers, 128 x 1 grouping, 256-key steps; ratio to exp2 without the term)")
    print_table(means, "V residual")


if __name__ == "__main__":
    main()
