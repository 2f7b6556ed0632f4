"""The mixed P encoding's error, emulated on CPU: how much of fidelity mode's exp2 can the chord take over.

reference p="mixed" encodes the last chord_eighths eighths of every online-softmax step's keys with the ExpCast chord
(no MUFU) and the rest with exp2 + cast at row max 448. This sweeps the share on the video-like data with fidelity
mode's quantizers (Q scale per row, K per 256 keys, V-Smooth residual per channel, the exact running max over the
Hopper head-dim-128 kernel's 256-key steps) and the fidelity preset's clusters (128 x 1, chain ids), against float64
exact attention: rel-L2 of the bf16 output, mean over the seeds, and each row's ratio to exp2 + cast at 256 (the spec
of p="exp2"). The share is the kernel variant's VC_SM90_EXP2_CHORD_EIGHTHS (docs/kernel-notes.md section 36).

    python3 bench/mixed_encoding_study.py --sizes 32760 75600 --seeds 0 1 2
"""
from __future__ import annotations

import argparse
import time

import torch

from vc_attention.bench import fidelity_study as fs
from vc_attention.kernels import reference as ref
from vc_attention.kernels.config import FIDELITY

STEP = 256  # keys per online-softmax step of the Hopper fidelity loop at head dim 128
SHARES = (0, 2, 4, 6, 8)  # chord eighths: 0 is exp2 + cast at 448 for every key, 8 the speed chord for every key


def rel_l2(case: fs.Case, p: torch.Tensor) -> float:
    p = p / p.sum(-1, keepdim=True)
    out = (p.float() @ case.v_hat["channel"]).double()
    return ((out.bfloat16().double() - case.exact).norm() / case.exact.norm()).item()


def case_rows(case: fs.Case) -> dict[str, float]:
    """Row label -> rel-L2 of one case: exp2 at 256 (p="exp2"), then p="mixed" at every share."""
    qs = case.q.float() * torch.tensor(ref.qk_scale(case.q.shape[-1], None), dtype=torch.float32)
    q_q, q_sc = fs.int8_rows(qs, "1")
    k_q, k_sc = fs.int8_rows(ref.smooth_k(case.k_perm)[0], str(FIDELITY.k_scale_rows))
    acc = torch.matmul(q_q[:, :, case.rows], k_q.transpose(-1, -2))
    sc = q_sc[:, :, case.rows] * k_sc.transpose(-1, -2)
    s = acc * sc  # reference.scores_log2's order
    rows = {"exp2 + cast, row max 256 (p=exp2, fidelity today)": rel_l2(case, ref.quantize_p(s, FIDELITY, STEP))}
    mixed = FIDELITY.with_(p="mixed")
    for eighths in SHARES:
        label = {0: "exp2 + cast at 448 for every key (mixed, chord 0/8)",
                 8: "the chord for every key (mixed, chord 8/8)"}.get(eighths, f"mixed, chord {eighths}/8")
        p = ref.quantize_p(s, mixed, STEP, acc=acc.to(torch.int64), scale=sc, chord_eighths=eighths)
        rows[label] = rel_l2(case, p)
    return rows


def sweep(case_rows_of, argv, default_seeds, description: str) -> tuple[dict[int, dict[str, float]], argparse.Namespace]:
    """The studies' shared loop (this one and bench/v_lo_study.py): {size: {row label: rel-L2 mean over the seeds}}
    of case_rows_of(case) on the video-like data with the fidelity preset's clusters (128 x 1, chain ids)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--sizes", type=int, nargs="+", default=[32760], choices=[32760, 75600])
    parser.add_argument("--seeds", type=int, nargs="+", default=default_seeds)
    parser.add_argument("--rows", type=int, default=256, help="query rows sampled per head")
    parser.add_argument("--heads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    means: dict[int, dict[str, float]] = {}
    for n in args.sizes:
        for seed in args.seeds:
            start = time.time()
            case = fs.make_case("video", n, args.heads, args.rows, seed, fs.Grouping(128, 1, "chain"))
            for label, err in case_rows_of(case).items():
                means.setdefault(n, {})[label] = means.get(n, {}).get(label, 0.0) + err / len(args.seeds)
            print(f"N={n} seed={seed}: {time.time() - start:.0f} s", flush=True)
    return means, args


def print_table(means: dict[int, dict[str, float]], first_column: str) -> None:
    """One markdown row per label: each size's rel-L2 and its ratio to the first row."""
    print(f"| {first_column} | " + " | ".join(f"N = {n:,}" for n in means) + " |")
    print("|---" * (len(means) + 1) + "|")
    for label in next(iter(means.values())):
        cells = []
        for rows in means.values():
            base = next(iter(rows.values()))
            cells.append(f"{rows[label]:.5f} ({rows[label] / base:.3f}x)")
        print(f"| {label} | " + " | ".join(cells) + " |")


def main(argv=None) -> None:
    means, args = sweep(case_rows, argv, [0, 1, 2], __doc__.splitlines()[0])
    print(f"\nrel-L2 of the bf16 output vs float64 (video-like data, {args.rows} rows x {args.heads} heads, mean of seeds "
          f"{args.seeds}; fidelity's quantizers, 128 x 1 grouping, 256-key steps)")
    print_table(means, "P encoding")


if __name__ == "__main__":
    main()
