"""GPU check of the grouping-parameter study (docs/fidelity-study.md, "Grouping parameters").

Per grouping candidate, on the real kernels: rel-L2 of vc-fidelity and vc-speed (and SageAttention
2.2 once, when importable) against float64 exact attention on `vc-attention bench`'s video-like
data (21 x 30 x 52 = 32,760 tokens, or Wan 720p's 21 x 45 x 80 = 75,600 with --sizes; 2 heads,
1,024 sampled query rows; seeds 0 and 1), and the grouping time (group_tokens + perm, eager and
CUDA-graph replay, median of 10) at the Wan2.2-14B 720p shape (1, 40, 75600, 128). Within-cluster
orders (study/within_cluster_order.py) have no GPU kernel: their rel-L2 rows use the torch emulation
of the ordering, and their time is not measured.

    python3 bench/grouping_fidelity_gpu.py
    python3 bench/grouping_fidelity_gpu.py --groupings 64x2 64x4 128x2 64x2:chain:chain
    # the presets' grouping choice (nodes/presets.py), results committed:
    python3 bench/grouping_fidelity_gpu.py --sizes 32760 75600 --groupings 64x1 64x2 64x4 128x1 128x2 \
        --out bench/results/nvidia-h200-preset-groupings.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch

from vc_attention.bench.fidelity_study import Grouping, parse_grouping
from vc_attention.bench.grouping_bench import time_grouping
from vc_attention.commands.bench_attention import FIDELITY_GRID, FIDELITY_HEADS, FIDELITY_ROWS
from vc_attention.commands.bench_peers import SAGE, peer_methods, vc_methods
from vc_attention.kernels import backends, grouping
from vc_attention.kernels.config import SPEED
from vc_attention.study import within_cluster_order
from vc_attention.study.videodata import video_like_qkv

DEFAULT = ("64x2", "64x3", "64x4", "32x2", "128x2", "64x2:chain:chain")
WAN = (1, 40, 75600, 128)
GRIDS = {32760: FIDELITY_GRID, 75600: (21, 45, 80)}  # Wan 480p / 720p latents after 1x2x2 patches


def candidate_perm(v: torch.Tensor, g: Grouping) -> torch.Tensor:
    """The node's grouping (chain ids) with the candidate's clusters, iterations and within-cluster order."""
    if g.ids != "chain":
        raise ValueError(f"grouping {g.label}: the GPU check measures the node's chain ids only.")
    compact = grouping.group_tokens(v, g.clusters, g.iters)
    if g.within == "none":
        return compact.perm()
    return within_cluster_order.permutation(v, compact.labels, g.clusters, g.within).to(torch.int32)


def rel_l2_rows(groupings: list[Grouping], seeds: list[int], tokens: int = 32760) -> dict:
    """{(method, grouping label or None for SageAttention): mean rel-L2 over seeds} at `tokens` (GRIDS)."""
    grid = GRIDS[tokens]
    out: dict = {}
    for seed in seeds:
        q, k, v = video_like_qkv(B=1, H=FIDELITY_HEADS, T=grid[0], Hgrid=grid[1], Wgrid=grid[2], D=128, seed=seed,
                                 dtype=torch.bfloat16, device="cuda")
        rows = torch.randperm(q.shape[2], generator=torch.Generator().manual_seed(seed))[:FIDELITY_ROWS].to("cuda")
        exact = torch.softmax(q[:, :, rows].double() @ k.double().transpose(-1, -2) / 128 ** 0.5, dim=-1) @ v.double()

        def err(out_full):
            return float((out_full[:, :, rows].double() - exact).norm() / exact.norm()) / len(seeds)

        chosen = backends.select(q, SPEED, "bhnd", "auto", allow_slow=False).name
        ours = [m for m in vc_methods(chosen, False) if m.name != "vc-plain8"]
        for g in groupings:
            perm = candidate_perm(v, g)
            for m in ours:
                out[m.name, g.label] = out.get((m.name, g.label), 0.0) + err(m.fn(q, k, v, perm))
        for m in peer_methods():
            if m.name == SAGE:
                out[m.name, None] = out.get((m.name, None), 0.0) + err(m.fn(q, k, v, None))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groupings", type=parse_grouping, nargs="+", default=[parse_grouping(g) for g in DEFAULT])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32760], choices=sorted(GRIDS))
    parser.add_argument("--out", default=None, help="also write the rows and the environment to this JSON file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("grouping_fidelity_gpu.py needs a CUDA GPU.")
    times = {g.label: time_grouping(*WAN, clusters=g.clusters, iters=g.iters) for g in args.groupings
             if g.within == "none"}
    rows = []
    for tokens in args.sizes:
        errors = rel_l2_rows(args.groupings, args.seeds, tokens)
        sage = errors.get((SAGE, None))
        print(f"rel-L2 on video-like data, N = {tokens:,}, {FIDELITY_ROWS} rows x {FIDELITY_HEADS} heads, mean of seeds "
              f"{args.seeds}; grouping ms at Wan2.2-14B 720p {WAN}")
        print(f"SageAttention 2.2: {'not importable' if sage is None else f'{sage:.5f}'}")
        print("| grouping | vc-fidelity | x SA2.2 | vc-speed | x SA2.2 | grouping ms (eager) | graph ms |")
        print("|---|---|---|---|---|---|---|")
        for g in args.groupings:
            fid, spd = errors["vc-fidelity", g.label], errors["vc-speed", g.label]
            ratio = (lambda e: "-" if sage is None else f"{e / sage:.3f}")
            t = times.get(g.label)
            shown = "not a kernel | -" if t is None else f"{t['group_ms']:.2f} | {t['graph_group_ms']:.2f}"
            print(f"| {g.label} | {fid:.5f} | {ratio(fid)} | {spd:.5f} | {ratio(spd)} | {shown} |")
            rows.append(dict(tokens=tokens, grouping=g.label, rel_l2_fidelity=fid, rel_l2_speed=spd, rel_l2_sageattn=sage,
                             grouping_ms_wan=None if t is None else t["group_ms"],
                             grouping_graph_ms_wan=None if t is None else t["graph_group_ms"]))
    if args.out:
        env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                   date=datetime.date.today().isoformat(), command="python3 bench/grouping_fidelity_gpu.py " + " ".join(
                       sys.argv[1:] if argv is None else argv), seeds=args.seeds, rows_sampled=FIDELITY_ROWS,
                   heads=FIDELITY_HEADS)
        with open(args.out, "w") as f:
            json.dump(dict(env=env, rows=rows), f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
