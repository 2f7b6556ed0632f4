"""Error versus cost of the V-Smooth grouping on video-like data: how DEFAULT_CLUSTERS/ITERS were chosen.

    python3 bench/grouping_sweep.py --json 720p.json                                   # Wan2.2 720p grid
    python3 bench/grouping_sweep.py --frames 2 --height 30 --width 52 --json small.json  # calibrated sample
    python3 bench/grouping_sweep.py --combine 720p.json small.json --plot docs/grouping-defaults.png
    python3 bench/grouping_sweep.py --qkv capture.safetensors --entry block10_step2_cond --json real.json

For every (clusters, iters) it groups V (kernels/grouping.group_tokens), applies V-Smooth in the
permuted order (reference.quantize_v_vsmooth) and measures
- energy removed: the fraction of ||V||^2 that subtracting each 128-row block mean removes;
- V-term error: ||P (Vhat - V)|| / ||P V|| over sampled query rows, P the exact (float64) softmax,
  Vhat the dequantized V-Smooth V put back in token order (the P_q(V - V_q) term of the paper, with
  the exact P standing in for P_q: the difference is second order);
- CPU time of group_tokens + perm (best of `repeats`, this machine's threads) and the estimated HBM
  traffic of the CUDA path (bytes_per_grouping), the quantity that sets its GPU time.
Each with the clusters renumbered along a chain (the default) and without (`_unordered`, the
reference's permutation). Also: the same V-term for per-channel FP8 V (no grouping) and for V-Smooth
in the original token order; warm starts from the previous step's centroids; the 16-bit (bf16)
distance path.
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch

from vc_attention.kernels import grouping, reference
from vc_attention.kernels.config import FIDELITY, PLAIN_8BIT
from vc_attention.study import videodata

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


# Cost model at the deployment shape (Wan2.2-14B 720p, B1 H40 N75600 D128) on an H200, used to rank
# settings; `python3 bench/grouping_bench.py` on the GPU measures the real thing.
DEPLOY_GROUPS, DEPLOY_N, DEPLOY_D = 40, 75600, 128
HBM_BYTES_PER_S = 3.0e12  # what bandwidth-bound torch kernels reach of the H200's 4.8 TB/s
LAUNCH_S = 5e-6  # one eager PyTorch op from Python, CPU side (CUDA graphs remove most of it)


def launches(clusters: int, iters: int) -> int:
    """Kernels of one group_tokens + perm: ~8 per assignment, ~8 per update, 4 per chain step."""
    return 8 * (iters + 1) + 8 * iters + 4 * (clusters - 1) + 20


def deploy_ms_est(clusters: int, iters: int) -> float:
    """Estimated eager GPU time of one grouping step at the deployment shape (a model)."""
    traffic = bytes_per_grouping(DEPLOY_GROUPS, DEPLOY_N, DEPLOY_D, clusters, iters) / HBM_BYTES_PER_S
    return 1e3 * (traffic + launches(clusters, iters) * LAUNCH_S)


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


def choose_default(results: list[dict]) -> dict:
    """The (clusters, iters) with the least estimated deployment cost (deploy_ms_est) among those
    within TOLERANCE of the best V-term error on EVERY data set."""
    def good(rows):
        best = min(r["v_term"] for r in rows)
        return {(r["clusters"], r["iters"]) for r in rows if r["v_term"] <= (1.0 + TOLERANCE) * best}

    allowed = set.intersection(*(good(res["sweep"]) for res in results))
    candidates = [r for r in results[0]["sweep"] if (r["clusters"], r["iters"]) in allowed]
    chosen = min(candidates, key=lambda r: (deploy_ms_est(r["clusters"], r["iters"]), r["v_term"]))
    cost = deploy_ms_est(chosen["clusters"], chosen["iters"])
    return {"clusters": chosen["clusters"], "iters": chosen["iters"], "deploy_ms_est": cost}


def warm_start_study(v, p, clusters: int, cold_iters: int, noise: float) -> list[dict]:
    """Next grouping step emulated as V + noise * rms(V) * gaussian: warm starts from the previous
    centroids with few iterations versus cold starts."""
    gen = torch.Generator().manual_seed(1)
    v_next = v + noise * v.float().square().mean().sqrt() * torch.randn(v.shape, generator=gen)
    previous = grouping.group_tokens(v, clusters, cold_iters)
    rows = []
    for iters in sorted({0, 1, 2, cold_iters}):
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


def plot(results: list[dict], chosen: dict, path: str) -> None:
    """One row per data set: V-term error vs estimated GPU traffic, energy removal vs iterations."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(13, 4.4 * len(results)), squeeze=False)
    for (left, right), res in zip(axes, results):
        rows, base = res["sweep"], res["baselines"]
        for clusters in CLUSTERS:
            mine = [r for r in rows if r["clusters"] == clusters]
            cost = [deploy_ms_est(r["clusters"], r["iters"]) for r in mine]
            line = left.plot(cost, [r["v_term"] for r in mine], "o-", label=f"{clusters} clusters")[0]
            left.plot(cost, [r["v_term_unordered"] for r in mine], "x:", color=line.get_color(), alpha=0.6)
            right.plot([r["iters"] for r in mine], [r["energy_removed"] for r in mine], "o-",
                       label=f"{clusters} clusters")
        pick = next(r for r in rows if (r["clusters"], r["iters"]) == (chosen["clusters"], chosen["iters"]))
        left.plot(chosen["deploy_ms_est"], pick["v_term"], "k*", ms=16, label="default")
        left.axhline(base["v_term_original_order"], color="grey", ls="--", label="V-Smooth, original order")
        left.axhline(base["v_term_per_channel_fp8"], color="black", ls=":", label="per-channel FP8 V")
        left.set_xscale("log")
        left.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        left.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        left.set_xticks([2, 3, 4, 6, 8, 12, 16, 24, 32])
        left.set_xlabel("modelled H200 ms of one grouping at B1 H40 N75600 (points: iters 1, 2, 4, 8)")
        left.set_ylabel("V-term error ||P(Vhat-V)|| / ||PV||")
        left.set_title("error vs cost (o-: clusters renumbered along a chain, x: k-means ids)", fontsize=9)
        left.legend(fontsize=7)
        right.axhline(base["energy_removed_original_order"], color="grey", ls="--", label="original order")
        right.set_xscale("log", base=2)
        right.set_xlabel("k-means iterations")
        right.set_ylabel("fraction of ||V||^2 removed by 128-row block means")
        right.set_title(base["title"], fontsize=8)
        right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def measure(args, previous: dict | None = None) -> dict:
    """The sweep (unless `previous` holds one) plus the warm-start and bf16 studies at the defaults."""
    if args.qkv:
        q, k, v = (t.float() for t in videodata.load_captured_qkv(args.qkv, args.entry))
        source = f"captured {args.qkv}" + (f" [{args.entry}]" if args.entry else "")
    else:
        q, k, v = videodata.video_like_qkv(
            B=1, H=args.heads, T=args.frames, Hgrid=args.height, Wgrid=args.width, seed=args.seed
        )
        source = f"video-like V (study/videodata.py, seed {args.seed})"
    b, h, n, d = v.shape
    rows_sampled = torch.randperm(n, generator=torch.Generator().manual_seed(7))[: args.query_rows]
    p = exact_probabilities(q, k, rows_sampled)
    if previous is None:
        baselines = {
            "title": (
                f"{source}, B{b} H{h} N{n} D{d}, CPU {torch.get_num_threads()} threads, torch {torch.__version__}"
            ),
            "v_term_per_channel_fp8": v_term_error(p, v, None, PLAIN_8BIT),
            "v_term_original_order": v_term_error(p, v, None),
            "energy_removed_original_order": energy_removed(v),
        }
        print(json.dumps(baselines), flush=True)
        result = {"baselines": baselines, "sweep": sweep(q, k, v, p, args.repeats)}
    else:
        result = {"baselines": previous["baselines"], "sweep": previous["sweep"]}
    result["defaults"] = {"clusters": grouping.DEFAULT_CLUSTERS, "iters": grouping.DEFAULT_ITERS}
    result["warm_start"] = warm_start_study(v, p, grouping.DEFAULT_CLUSTERS, grouping.DEFAULT_ITERS, noise=0.2)
    result["bf16_path"] = bf16_study(v, p, grouping.DEFAULT_CLUSTERS, grouping.DEFAULT_ITERS)
    print(json.dumps({key: result[key] for key in ("defaults", "warm_start", "bf16_path")}, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=21)
    parser.add_argument("--height", type=int, default=45)
    parser.add_argument("--width", type=int, default=80)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--qkv", help="a capture file (vc_attention_capture safetensors) instead of video-like data")
    parser.add_argument("--entry", help="which captured call in --qkv (default: the first)")
    parser.add_argument("--query-rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument("--combine", nargs="+", metavar="JSON",
                        help="instead of measuring: choose the defaults from these sweeps and plot them")
    parser.add_argument("--plot", help="write the error-vs-cost PNG here (with --combine)")
    parser.add_argument("--studies-only", action="store_true",
                        help="keep the sweep already in --json; redo only the studies at the current defaults")
    args = parser.parse_args(argv)

    if args.combine:
        results = []
        for path in args.combine:
            with open(path) as f:
                results.append(json.load(f))
        chosen = choose_default(results)
        print(f"chosen: {chosen} (least traffic within {TOLERANCE:.0%} of the best V-term on every data set)")
        if args.plot:
            plot(results, chosen, args.plot)
        return 0
    previous = None
    if args.studies_only:
        if not args.json:
            raise SystemExit("--studies-only needs --json FILE holding an earlier sweep.")
        with open(args.json) as f:
            previous = json.load(f)
    result = measure(args, previous)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
