"""Error versus cost of the V-Smooth grouping on video-like data: how DEFAULT_CLUSTERS/ITERS were chosen.

    python3 bench/grouping_sweep.py --json docs/grouping-sweep.json --plot docs/grouping-defaults.png

For every (clusters, iters) it groups V (kernels/grouping.group_tokens), applies V-Smooth in the
permuted order (reference.quantize_v_vsmooth) and measures
- energy removed: the fraction of ||V||^2 that subtracting each 128-row block mean removes;
- V-term error: ||P (Vhat - V)|| / ||P V|| over sampled query rows, P the exact (float64) softmax,
  Vhat the dequantized V-Smooth V put back in token order (the P_q(V - V_q) term of the paper, with
  the exact P standing in for P_q: the difference is second order);
- CPU time of group_tokens + perm (best of `repeats`, this machine's threads) and the estimated HBM
  traffic of the CUDA path (bytes_per_grouping), the quantity that sets its GPU time.
Each with the clusters renumbered along a chain (the default) and without (`_unordered`, the
reference's permutation). Also: the same V-term for per-channel FP8 V (no grouping) and for V-Smooth in the original token
order; warm starts from the previous step's centroids; the 16-bit (bf16) distance path.
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch

from vc_attention.kernels import grouping, reference, videodata
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT

CLUSTERS = (8, 16, 32, 64, 128, 256)
ITERS = (1, 2, 4, 8)
TOLERANCE = 0.03  # a default may be this much (relative) worse in V-term error than the grid's best


def exact_probabilities(q: torch.Tensor, k: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Softmax rows (float64) of the sampled queries against all keys, (B,H,R,N)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    return torch.softmax(q[:, :, rows].double() @ k.double().transpose(-1, -2) * scale, dim=-1)


def unpermute(x_perm: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Inverse of reference.permute_tokens: x[perm[i]] = x_perm[i]."""
    index = perm.long().unsqueeze(-1).expand_as(x_perm)
    return torch.empty_like(x_perm).scatter_(2, index, x_perm)


def energy_removed(v_perm: torch.Tensor) -> float:
    """1 - ||V - block means||^2 / ||V||^2 over 128-row blocks of the permuted V (fp16 means)."""
    means = reference.block_means_fp16(v_perm).float()
    expanded = means.repeat_interleave(reference.V_BLOCK, dim=2)[:, :, : v_perm.shape[2]]
    v = v_perm.double()
    return 1.0 - ((v - expanded.double()).square().sum() / v.square().sum()).item()


def v_term_error(p: torch.Tensor, v: torch.Tensor, perm: torch.Tensor | None, config=FIDELITY) -> float:
    """||P (Vhat - V)|| / ||P V|| with Vhat the V the kernel uses (after `perm`, back in token order)."""
    v_perm = v if perm is None else reference.permute_tokens(v, perm.long())
    error = reference.dequantized_v(v_perm, config) - v_perm
    if perm is not None:
        error = unpermute(error, perm)
    return ((p @ error.double()).norm() / (p @ v.double()).norm()).item()


def bytes_per_grouping(groups: int, n: int, d: int, clusters: int, iters: int) -> int:
    """Estimated HBM traffic of the CUDA bf16 path (kernels/grouping.py), a model, not a measurement.

    Per assignment: read x_aug (N x D' bf16), write + read the N x C float32 scores, write labels.
    Per update: zero + scatter + read the N x C bf16 one-hot, read x_aug. Once: build x_aug; sort.
    """
    d_aug = (d + 3 + 7) // 8 * 8
    assign = n * (2 * d_aug + 8 * clusters + 8)
    update = n * (2 * d_aug + 4 * clusters + 10)
    once = n * (2 * d + 2 * d_aug + 16)
    return groups * ((iters + 1) * assign + iters * update + once)


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def sweep(q, k, v, p, repeats: int) -> list[dict]:
    b, h, n, d = v.shape
    rows = []
    for clusters in CLUSTERS:
        for iters in ITERS:
            seconds = best_time(lambda: grouping.group_tokens(v, clusters, iters).perm(), repeats)
            perm = grouping.group_tokens(v, clusters, iters).perm()
            plain = grouping.group_tokens(v, clusters, iters, order_clusters=False).perm()
            rows.append(
                {
                    "clusters": clusters,
                    "iters": iters,
                    "energy_removed": energy_removed(reference.permute_tokens(v, perm.long())),
                    "v_term": v_term_error(p, v, perm),
                    "energy_removed_unordered": energy_removed(reference.permute_tokens(v, plain.long())),
                    "v_term_unordered": v_term_error(p, v, plain),
                    "cpu_ms": 1e3 * seconds,
                    "gpu_bytes_est": bytes_per_grouping(b * h, n, d, clusters, iters),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def choose_default(rows: list[dict]) -> dict:
    """The least GPU traffic among the settings within TOLERANCE of the best V-term error."""
    best = min(r["v_term"] for r in rows)
    good = [r for r in rows if r["v_term"] <= (1.0 + TOLERANCE) * best]
    return min(good, key=lambda r: (r["gpu_bytes_est"], r["v_term"]))


def warm_start_study(v, p, clusters: int, cold_iters: int, noise: float) -> list[dict]:
    """Next grouping step emulated as V + noise * rms(V) * gaussian: warm starts from the previous
    centroids with few iterations versus cold starts."""
    gen = torch.Generator().manual_seed(1)
    v_next = v + noise * v.float().square().mean().sqrt() * torch.randn(v.shape, generator=gen)
    previous = grouping.group_tokens(v, clusters, cold_iters)
    rows = []
    for iters in (0, 1, 2, cold_iters):
        for start in ("warm", "cold"):
            g = grouping.group_tokens(v_next, clusters, iters, warm_start=previous if start == "warm" else None)
            perm = g.perm()
            rows.append(
                {
                    "start": start,
                    "iters": iters,
                    "energy_removed": energy_removed(reference.permute_tokens(v_next, perm.long())),
                    "v_term": v_term_error(p, v_next, perm),
                }
            )
    return rows


def bf16_study(v, p, clusters: int, iters: int) -> dict:
    """The CUDA bf16 path, emulated exactly on the CPU: label agreement and V-term vs float32."""
    b, h, n, d = v.shape
    x = v.to(torch.bfloat16).flatten(0, 1)
    init = x.index_select(1, reference.kmeans_init_indices(n, clusters, 0)).float()
    labels_16, _ = grouping._lloyd(x, init, iters)
    labels_32, _ = reference.kmeans_labels(x.float().view(b, h, n, d), clusters, iters)
    v16 = x.float().view(b, h, n, d)
    perm_16 = grouping.permutation_from_labels(labels_16.view(b, h, n), clusters)
    perm_32 = grouping.permutation_from_labels(labels_32, clusters)
    return {
        "label_agreement": (labels_16.view(b, h, n) == labels_32).float().mean().item(),
        "v_term_bf16_path": v_term_error(p, v16, perm_16),
        "v_term_fp32_reference": v_term_error(p, v16, perm_32),
    }


def plot(rows: list[dict], chosen: dict, baselines: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for clusters in CLUSTERS:
        mine = [r for r in rows if r["clusters"] == clusters]
        left.plot([r["gpu_bytes_est"] / 1e9 for r in mine], [r["v_term"] for r in mine], "o-", label=f"{clusters} clusters")
        right.plot([r["iters"] for r in mine], [r["energy_removed"] for r in mine], "o-", label=f"{clusters} clusters")
    left.axhline(baselines["v_term_original_order"], color="grey", ls="--", label="V-Smooth, original order")
    left.plot(chosen["gpu_bytes_est"] / 1e9, chosen["v_term"], "k*", ms=16, label="default")
    left.set_xscale("log")
    left.set_xlabel("estimated GPU memory traffic per grouping, GB (points: iters 1, 2, 4, 8)")
    left.set_ylabel("V-term error ||P(Vhat-V)|| / ||PV||")
    left.set_title("error vs cost")
    left.legend(fontsize=8)
    right.axhline(baselines["energy_removed_original_order"], color="grey", ls="--", label="original order")
    right.set_xscale("log", base=2)
    right.set_xlabel("k-means iterations")
    right.set_ylabel("fraction of ||V||^2 removed by 128-row block means")
    right.set_title("block-mean energy removal")
    right.legend(fontsize=8)
    fig.suptitle(baselines["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=21)
    parser.add_argument("--height", type=int, default=45)
    parser.add_argument("--width", type=int, default=80)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--query-rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument("--plot", help="write the error-vs-cost PNG here")
    args = parser.parse_args(argv)

    q, k, v = videodata.video_like_qkv(B=1, H=args.heads, T=args.frames, Hgrid=args.height, Wgrid=args.width, seed=args.seed)
    n = v.shape[2]
    rows_sampled = torch.randperm(n, generator=torch.Generator().manual_seed(7))[: args.query_rows]
    p = exact_probabilities(q, k, rows_sampled)
    title = (
        f"video-like V (kernels/videodata.py, seed {args.seed}), B1 H{args.heads} N{n} D128, "
        f"CPU {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    baselines = {
        "title": title,
        "v_term_per_channel_fp8": v_term_error(p, v, None, PLAIN_8BIT),
        "v_term_original_order": v_term_error(p, v, None),
        "energy_removed_original_order": energy_removed(v),
    }
    print(json.dumps(baselines), flush=True)
    rows = sweep(q, k, v, p, args.repeats)
    chosen = choose_default(rows)
    result = {
        "baselines": baselines,
        "sweep": rows,
        "chosen": chosen,
        "warm_start": warm_start_study(v, p, chosen["clusters"], chosen["iters"], noise=0.2),
        "bf16_path": bf16_study(v, p, chosen["clusters"], chosen["iters"]),
    }
    print(json.dumps({k: result[k] for k in ("chosen", "warm_start", "bf16_path")}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        plot(rows, chosen, baselines, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
