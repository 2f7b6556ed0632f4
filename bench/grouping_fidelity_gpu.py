"""GPU check of the grouping-parameter study (docs/fidelity-study.md, "Grouping parameters").

Per grouping candidate, on the real kernels: rel-L2 of vc-fidelity and vc-speed (and SageAttention
2.2 once, when importable) against float64 exact attention on `vc-attention bench`'s video-like
data (21 x 30 x 52 = 32,760 tokens, or Wan 720p's 21 x 45 x 80 = 75,600 with --sizes; 2 heads,
1,024 sampled query rows; seeds 0 and 1), and the grouping time (group_tokens + perm, eager and
CUDA-graph replay, median of 10) at the Wan2.2-14B 720p shape (1, 40, 75600, 128). Within-cluster
orders of the study (study/within_cluster_order.py, ':chain:chain16' and the like) use its torch
emulation and are not timed; `--kernel-bins 8 16` adds, for every grouping without one, rows with the
node's within-cluster kernel (kernels/grouping_within.py: group_tokens(within_bins=...)), timed with the
grouping step and as a reuse step's permutation (label sort + the kernel).

    python3 bench/grouping_fidelity_gpu.py
    python3 bench/grouping_fidelity_gpu.py --groupings 64x2 64x4 128x2 64x2:chain:chain
    # the presets' grouping choice (nodes/presets.py), results committed:
    python3 bench/grouping_fidelity_gpu.py --sizes 32760 75600 --groupings 64x1 64x2 64x4 128x1 128x2 \
        --out bench/results/nvidia-h200-preset-groupings.json
    # the within-cluster kernel against the study's emulation of it (docs/fidelity-study.md, last section):
    python3 bench/grouping_fidelity_gpu.py --sizes 32760 75600 --groupings 128x1 128x1:chain:chain16 \
        --kernel-bins 8 16 --out bench/results/nvidia-h200-within-bins.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch

from vc_attention.bench.fidelity_study import Grouping, parse_grouping
from vc_attention.bench.grouping_bench import _median_ms, random_v, time_grouping
from vc_attention.commands.bench_attention import FIDELITY_GRID, FIDELITY_HEADS, FIDELITY_ROWS
from vc_attention.commands.bench_peers import SAGE, peer_methods, vc_methods
from vc_attention.kernels import backends, grouping
from vc_attention.kernels.config import SPEED
from vc_attention.study import within_cluster_order
from vc_attention.study.videodata import video_like_qkv

DEFAULT = ("64x2", "64x3", "64x4", "32x2", "128x2", "64x2:chain:chain")
WAN = (1, 40, 75600, 128)
GRIDS = {32760: FIDELITY_GRID, 75600: (21, 45, 80)}  # Wan 480p / 720p latents after 1x2x2 patches


def kernel_label(g: Grouping, bins: int) -> str:
    return f"{g.label}, kernel bins {bins}"


def candidates(groupings: list[Grouping], kernel_bins: list[int]) -> list[tuple[str, Grouping, int]]:
    """(row label, grouping, within-cluster kernel bins or 0) for every row of the table."""
    rows = [(g.label, g, 0) for g in groupings]
    rows += [(kernel_label(g, b), g, b) for g in groupings if g.within == "none" for b in kernel_bins]
    return rows


def candidate_perm(v: torch.Tensor, g: Grouping, kernel_bins: int = 0) -> torch.Tensor:
    """The node's grouping (chain ids) with the candidate's clusters, iterations and within-cluster order
    (the study's emulation, or with kernel_bins the node's kernel)."""
    if g.ids != "chain":
        raise ValueError(f"grouping {g.label}: the GPU check measures the node's chain ids only.")
    if kernel_bins:
        return grouping.group_tokens(v, g.clusters, g.iters, within_bins=kernel_bins).perm()
    compact = grouping.group_tokens(v, g.clusters, g.iters, within_bins=0)
    if g.within == "none":
        return compact.perm()
    return within_cluster_order.permutation(v, compact.labels, g.clusters, g.within).to(torch.int32)


def time_within(g: Grouping, bins: int, repeats: int = 10) -> dict:
    """Median ms at Wan2.2-14B 720p of a grouping step with the within-cluster kernel (group_tokens + perm)
    and of a reuse step's permutation (the cached labels sorted + the kernel on the call's V)."""
    v = random_v(*WAN, torch.bfloat16)
    cached = grouping.group_tokens(v, g.clusters, g.iters, within_bins=bins)
    cached.perm()
    return {"group_ms": _median_ms(lambda: grouping.group_tokens(v, g.clusters, g.iters, within_bins=bins).perm(),
                                   repeats),
            "reuse_perm_ms": _median_ms(lambda: cached.perm(v), repeats),
            "reuse_perm_plain_ms": _median_ms(lambda: cached._label_perm(), repeats)}


def rel_l2_rows(groupings: list[Grouping], seeds: list[int], tokens: int = 32760, kernel_bins=()) -> dict:
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
        for label, g, bins in candidates(groupings, list(kernel_bins)):
            perm = candidate_perm(v, g, bins)
            for m in ours:
                out[m.name, label] = out.get((m.name, label), 0.0) + err(m.fn(q, k, v, perm))
        for m in peer_methods():
            if m.name == SAGE:
                out[m.name, None] = out.get((m.name, None), 0.0) + err(m.fn(q, k, v, None))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groupings", type=parse_grouping, nargs="+", default=[parse_grouping(g) for g in DEFAULT])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32760], choices=sorted(GRIDS))
    parser.add_argument("--kernel-bins", type=int, nargs="*", default=[],
                        help="within-cluster kernel bins to add to every grouping without a within-cluster order")
    parser.add_argument("--out", default=None, help="also write the rows and the environment to this JSON file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("grouping_fidelity_gpu.py needs a CUDA GPU.")
    times = {g.label: time_grouping(*WAN, clusters=g.clusters, iters=g.iters) for g in args.groupings
             if g.within == "none"}
    times.update({kernel_label(g, b): time_within(g, b) for g in args.groupings if g.within == "none"
                  for b in args.kernel_bins})
    rows = []
    for tokens in args.sizes:
        errors = rel_l2_rows(args.groupings, args.seeds, tokens, args.kernel_bins)
        sage = errors.get((SAGE, None))
        print(f"rel-L2 on video-like data, N = {tokens:,}, {FIDELITY_ROWS} rows x {FIDELITY_HEADS} heads, mean of seeds "
              f"{args.seeds}; grouping ms at Wan2.2-14B 720p {WAN}")
        print(f"SageAttention 2.2: {'not importable' if sage is None else f'{sage:.5f}'}")
        print("| grouping | vc-fidelity | x SA2.2 | vc-speed | x SA2.2 | grouping ms (eager) | graph / reuse perm ms |")
        print("|---|---|---|---|---|---|---|")
        for label, _, bins in candidates(args.groupings, args.kernel_bins):
            fid, spd = errors["vc-fidelity", label], errors["vc-speed", label]
            ratio = (lambda e: "-" if sage is None else f"{e / sage:.3f}")
            t = times.get(label)
            if t is None:
                shown = "not a kernel | -"
            elif bins:
                shown = f"{t['group_ms']:.2f} | reuse {t['reuse_perm_ms']:.3f} (labels only {t['reuse_perm_plain_ms']:.3f})"
            else:
                shown = f"{t['group_ms']:.2f} | {t['graph_group_ms']:.2f}"
            print(f"| {label} | {fid:.5f} | {ratio(fid)} | {spd:.5f} | {ratio(spd)} | {shown} |")
            rows.append(dict(tokens=tokens, grouping=label, within_kernel_bins=bins, rel_l2_fidelity=fid,
                             rel_l2_speed=spd, rel_l2_sageattn=sage,
                             grouping_ms_wan=None if t is None else t["group_ms"],
                             grouping_graph_ms_wan=None if t is None else t.get("graph_group_ms"),
                             reuse_perm_ms_wan=None if t is None else t.get("reuse_perm_ms"),
                             reuse_label_perm_ms_wan=None if t is None else t.get("reuse_perm_plain_ms")))
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
