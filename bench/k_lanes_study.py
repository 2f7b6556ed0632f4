"""K scales per MMA lane (VCConfig.k_lane_scales), emulated with the spec on the video-like data (CPU).

Each preset's configuration with and without lane scales, each with its grouping and with the within-cluster bins
(group_tokens(within_bins=8)), rel-L2 of the bf16 output against float64 attention on sampled query rows, the QK term
(P_q V - O) and the V term, mean over seeds. Everything but the row sampling is the spec itself: reference.lane_sorted,
quantize_qk, score_parts, quantize_p with the Hopper loop's 256-key step, dequantized_v.

    python3 bench/k_lanes_study.py --sizes 32760 --rows 256 --seeds 0 1
    python3 bench/k_lanes_study.py --sizes 75600 --rows 128 --seeds 0 1

--candidates names rows in bench/k_lanes_bench.py's form (MODE[+lanes]@CLUSTERSxITERS[bBINS], the grouping of
kernels.grouping.group_tokens) instead of the presets: issue 10's speed-mode candidates, each speed row's rel-L2 also
against the first fidelity row's (kernel-notes 41; --out writes the table's numbers as JSON):

    python3 bench/k_lanes_study.py --sizes 32760 75600 --rows 1024 --seeds 0 1 \
        --candidates fidelity@128x1b8,speed@64x2,speed@128x1b8,speed+lanes@64x2,speed+lanes@128x1b8
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from vc_attention.bench import fidelity_study as fs
from vc_attention.kernels import reference as ref
from vc_attention.kernels.config import FIDELITY, SPEED

# (label, config, grouping) per preset; the bins rows are the node's within-cluster order (group_tokens within_bins)
PRESETS = {"fidelity": (FIDELITY, "128x1"), "speed": (SPEED, "64x1")}
STEP_KEYS = 256  # the Hopper head-dim-128 V-Smooth loops' online-softmax step (Backend.softmax_step)


def measure(q, k_perm, v_perm, rows, config) -> dict:
    """rel-L2 / QK term / V term of the spec's output on query rows `rows` (K, V in the grouping's order)."""
    kb, vb = ref.lane_sorted(k_perm, v_perm, config)
    q_q, q_sc, k_q, k_sc = ref.quantize_qk(q, kb, config)
    acc, sc = ref.score_parts(q_q[:, :, rows], q_sc[:, :, rows], k_q, k_sc, kb.shape[-2])
    p = ref.quantize_p(acc * sc, config, STEP_KEYS, acc=acc, scale=sc, lanes=k_sc.dim() == 4)
    p = (p / p.sum(-1, keepdim=True)).float()
    logits = q[:, :, rows].double() @ kb.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    exact = torch.softmax(logits, -1) @ vb.double()
    out = (p @ ref.dequantized_v(vb, config).float()).double()
    out_exact_v = (p @ vb.float()).double()
    norm = exact.norm()
    return {"rel_l2": ((out.bfloat16().double() - exact).norm() / norm).item(),
            "qk_term": ((out_exact_v - exact).norm() / norm).item(),
            "v_term": ((out - out_exact_v).norm() / norm).item()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32760], choices=sorted(fs.GRIDS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--rows", type=int, default=256, help="query rows sampled per head")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--candidates", default="", help="rows in k_lanes_bench's form instead of the presets")
    parser.add_argument("--out", default="", help="--candidates: the JSON file to write")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    if args.candidates:
        return candidates(args, "python3 bench/k_lanes_study.py " + " ".join(sys.argv[1:] if argv is None else argv))
    results: dict = {}
    for n in args.sizes:
        for seed in args.seeds:
            q, k, v = fs.make_data("video", n, args.heads, seed)
            rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: args.rows].sort().values
            for preset in args.presets:
                config, grouping = PRESETS[preset]
                for within in ("none", "node8"):
                    start = time.time()
                    g = fs.parse_grouping(grouping if within == "none" else f"{grouping}:chain:{within}")
                    perm = fs.grouping_permutation(v, g, seed)
                    kp, vp = ref.permute_tokens(k, perm), ref.permute_tokens(v, perm)
                    for lanes in (False, True):
                        key = (n, preset, within, lanes)
                        results.setdefault(key, []).append(measure(q, kp, vp, rows, config.with_(k_lane_scales=lanes)))
                    print(f"N={n} seed={seed} {preset} {g.label}: {time.time() - start:.0f} s", flush=True)
    print(f"\nrel-L2 / QK term / V term (mean of seeds {args.seeds}; {args.rows} rows x {args.heads} heads, all keys)")
    print("| N | preset | grouping | K scales | rel-L2 | QK term | V term |\n|---|---|---|---|---|---|---|")
    for (n, preset, within, lanes), rs in results.items():
        mean = {m: sum(r[m] for r in rs) / len(rs) for m in ("rel_l2", "qk_term", "v_term")}
        base = results[(n, preset, "none", False)]
        rel = mean["rel_l2"] / (sum(r["rel_l2"] for r in base) / len(base)) - 1
        print(f"| {n} | {preset} | {PRESETS[preset][1]}{', 8 bins' if within != 'none' else ''} | "
              f"{'per lane' if lanes else 'per 256 keys'} | {mean['rel_l2']:.5f} ({rel:+.1%}) | {mean['qk_term']:.5f} | "
              f"{mean['v_term']:.5f} |")


def candidates(args, command: str) -> None:
    """rel-L2 / QK term / V term of each --candidates row (its own grouping), mean over seeds, per size."""
    from vc_attention.bench.k_lanes_bench import group, parse_rows

    rows_spec = parse_rows(args.candidates)
    results: dict = {}
    for n in args.sizes:
        for seed in args.seeds:
            q, k, v = fs.make_data("video", n, args.heads, seed)
            rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: args.rows].sort().values
            for label, config, grouping_spec in rows_spec:
                perm = group(v, grouping_spec, seed)
                kp, vp = ref.permute_tokens(k, perm), ref.permute_tokens(v, perm)
                results.setdefault((n, label), []).append(measure(q, kp, vp, rows, config))
            print(f"N={n} seed={seed} done", flush=True)
    base = next((label for label, _, _ in rows_spec if label.startswith("fidelity")), None)
    print(f"\nrel-L2 / QK term / V term (mean of seeds {args.seeds}; {args.rows} rows x {args.heads} heads, all keys)")
    print("| N | row | rel-L2 | x " + str(base) + " | QK term | V term |\n|---|---|---|---|---|---|")
    table = []
    for (n, label), rs in results.items():
        mean = {m: sum(r[m] for r in rs) / len(rs) for m in ("rel_l2", "qk_term", "v_term")}
        ratio = None
        if base is not None:
            ratio = mean["rel_l2"] / (sum(r["rel_l2"] for r in results[(n, base)]) / len(results[(n, base)]))
        table.append({"tokens": n, "row": label, **mean, "x_fidelity": ratio})
        print(f"| {n} | {label} | {mean['rel_l2']:.5f} | {'-' if ratio is None else f'{ratio:.3f}'} | "
              f"{mean['qk_term']:.5f} | {mean['v_term']:.5f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"command": command, "seeds": args.seeds, "rows_per_head": args.rows, "heads": args.heads, "table": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
