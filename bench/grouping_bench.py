"""GPU timing of the V-Smooth grouping (kernels/grouping.py) at deployment shapes.

    python3 bench/grouping_bench.py            # old (torch) vs fused grouping at the issue's shapes,
                                               # and its share of a speed-mode call, same run
    python3 bench/grouping_bench.py --batch 1 2  # details at Wan2.2-14B 720p (time_grouping)
    python3 bench/grouping_bench.py --passes tensor-cores,fp32  # both assignment passes, same run
Import and call `time_grouping(B, H, N, D, clusters, iters)` from the attention benchmark so the
grouping and the attention call it serves are timed in the same run.
Importing it has no side effects (no CUDA work until a function is called).
"""
from __future__ import annotations

import argparse
import contextlib

import torch

from vc_attention.commands.bench import cuda_time_ms
from vc_attention.kernels import grouping, grouping_fused

WAN22_720P = dict(H=40, N=75600, D=128)  # Wan2.2-14B at 1280x720, 81 frames

# name -> ((B, H, N, D), the most grouping may cost as a share of one speed-mode call: issue 14)
SHAPES = {
    "wan22-14b-720p": ((1, 40, 75600, 128), 0.05),
    "wan22-14b-720p-b2": ((2, 40, 75600, 128), 0.05),
    "wan21-1.3b-480p": ((1, 12, 32760, 128), 0.15),
    "d64": ((1, 32, 32768, 64), 0.50),
    "ltx-video": ((1, 32, 6144, 64), 0.50),
}


PASSES = {"tensor-cores": True, "fp32": False}  # --passes name -> grouping_fused.TENSOR_CORES


@contextlib.contextmanager
def assignment_pass(name: str):
    """Inside the block the fused grouping uses this assignment pass (bf16 V; fp16 always FP32)."""
    saved = grouping_fused.TENSOR_CORES
    grouping_fused.TENSOR_CORES = PASSES[name]
    try:
        yield
    finally:
        grouping_fused.TENSOR_CORES = saved


@contextlib.contextmanager
def torch_path():
    """Inside the block grouping.py runs its torch implementation (the grouping before the fused
    kernels), counted as a fallback with the reason "benchmark"."""
    saved = grouping_fused.unsupported_reason
    grouping_fused.unsupported_reason = lambda v, clusters: "benchmark"
    try:
        yield
    finally:
        grouping_fused.unsupported_reason = saved


def random_v(B: int, H: int, N: int, D: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    """Random non-zero V with some cluster structure: 32 centres per head plus unit noise."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    centres = torch.randn(B, H, 32, D, device="cuda", generator=gen) * 2.0
    pick = torch.randint(0, 32, (B, H, N), device="cuda", generator=gen)
    v = torch.gather(centres, 2, pick.unsqueeze(-1).expand(-1, -1, -1, D))
    return (v + torch.randn(B, H, N, D, device="cuda", generator=gen)).to(dtype)


def _median_ms(fn, repeats: int) -> float:
    return cuda_time_ms(fn, repeats, warmup=2)


def _graph_median_ms(v: torch.Tensor, clusters: int, iters: int, repeats: int) -> float:
    """group_tokens + perm captured once in a CUDA graph, median replay time."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        grouping.group_tokens(v, clusters, iters).perm()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouping.group_tokens(v, clusters, iters).perm()
    return _median_ms(graph.replay, repeats)


def labels_cache_bytes(
    layers: int, branches: int, B: int, H: int, N: int, clusters: int, D: int, centroids: bool
) -> int:
    """Bytes of CompactGrouping for every layer and CFG branch as the node's cache keeps them (labels +
    counts [+ E4M3 centroids with their scales]): nodes/cache.estimated_bytes with the batch folded in."""
    from vc_attention.nodes.cache import estimated_bytes

    return estimated_bytes(blocks=layers, branches=branches * B, heads=H, tokens=N, head_dim=D, clusters=clusters,
                           with_centroids=centroids)


def _onehot_cumsum_permutation(labels: torch.Tensor, clusters: int) -> torch.Tensor:
    """The other O(N)-per-cluster candidate, for comparison only: rank within the cluster from a
    cumulative sum of the one-hot matrix, plus the cluster's start offset, scattered."""
    onehot = torch.nn.functional.one_hot(labels.long(), clusters).to(torch.int32)  # (B,H,N,C)
    rank = onehot.cumsum(-2).gather(-1, labels.long().unsqueeze(-1)).squeeze(-1) - 1
    starts = onehot.sum(-2).cumsum(-1) - onehot.sum(-2)
    slot = starts.gather(-1, labels.long()) + rank
    src = torch.arange(labels.shape[-1], device=labels.device, dtype=torch.int32).expand_as(labels)
    return torch.empty_like(src).scatter_(-1, slot, src)


def time_grouping(
    B: int,
    H: int,
    N: int,
    D: int,
    clusters: int = grouping.DEFAULT_CLUSTERS,
    iters: int = grouping.DEFAULT_ITERS,
    dtype: torch.dtype = torch.bfloat16,
    repeats: int = 10,
    compare_permutations: bool = False,
) -> dict:
    """Median milliseconds of one grouping step on the current CUDA device.

    Returns {"kmeans_ms": cold k-means (seeded init), "warm_kmeans_ms": group_tokens from the previous
    centroids (same iters), "perm_ms": labels -> int32 perm, "group_ms": group_tokens + perm (what a
    grouping step costs, eager), "group_unordered_ms": the same without the cluster ordering,
    "graph_group_ms": group_tokens + perm replayed from a CUDA graph (no launch overhead),
    "cache_bytes_per_layer": CompactGrouping.nbytes, ...}; with
    compare_permutations also "argsort_int64_ms" and "onehot_cumsum_ms" for the other candidates.
    """
    if not torch.cuda.is_available():
        raise ValueError("time_grouping needs a CUDA GPU (it times with CUDA events).")
    v = random_v(B, H, N, D, dtype)

    previous = grouping.group_tokens(v, clusters, iters)
    labels = previous.labels
    result = {
        "shape": (B, H, N, D),
        "dtype": str(dtype),
        "clusters": clusters,
        "iters": iters,
        "kmeans_ms": _median_ms(lambda: grouping.kmeans(v, clusters, iters), repeats),
        "warm_kmeans_ms": _median_ms(lambda: grouping.group_tokens(v, clusters, iters, warm_start=previous), repeats),
        "perm_ms": _median_ms(lambda: grouping.permutation_from_labels(labels, clusters), repeats),
        "group_ms": _median_ms(lambda: grouping.group_tokens(v, clusters, iters).perm(), repeats),
        "group_unordered_ms": _median_ms(
            lambda: grouping.group_tokens(v, clusters, iters, order_clusters=False).perm(), repeats
        ),
        "graph_group_ms": _graph_median_ms(v, clusters, iters, repeats),
        "cache_bytes_per_layer": previous.nbytes,
        "cache_bytes_per_layer_no_centroids": grouping.CompactGrouping(previous.labels, previous.counts).nbytes,
    }
    if compare_permutations:
        result["argsort_int64_ms"] = _median_ms(lambda: torch.argsort(labels.long(), dim=-1, stable=True), repeats)
        result["onehot_cumsum_ms"] = _median_ms(lambda: _onehot_cumsum_permutation(labels, clusters), repeats)
    return result


def compare(shapes: dict, clusters: int, iters: int, repeats: int = 10, passes: tuple = ("tensor-cores",)) -> list[dict]:
    """Median ms of one grouping step (group_tokens + perm, eager and CUDA-graph replay) on the
    torch path ("old") and the fused kernels with each assignment pass of `passes` (one row each),
    and of one speed-mode call through the public op on the same V with the fused permutation;
    share = fused eager ms / speed call ms."""
    from vc_attention.kernels.api import vc_attention
    from vc_attention.kernels.backends import NoCapableBackend
    from vc_attention.kernels.config import SPEED

    rows = []
    for name, ((b, h, n, d), goal) in shapes.items():
        v = random_v(b, h, n, d)
        gen = torch.Generator(device="cuda").manual_seed(1)
        q, k = (torch.randn(b, h, n, d, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(2))

        def step():
            return grouping.group_tokens(v, clusters, iters).perm()

        with torch_path():
            old_ms = _median_ms(step, repeats)
        perm = step()
        try:
            speed_ms = _median_ms(lambda: vc_attention(q, k, v, config=SPEED, perm=perm), repeats)
        except NoCapableBackend as err:
            print(f"{name}: no speed-mode call ({err})")
            speed_ms = None
        for pass_name in passes:
            with assignment_pass(pass_name):
                fused_ms = _median_ms(step, repeats)
                graph_ms = _graph_median_ms(v, clusters, iters, repeats)
            rows.append(dict(shape=name, B=b, H=h, N=n, D=d, passes=pass_name, old_ms=old_ms, fused_ms=fused_ms,
                             fused_graph_ms=graph_ms, speed_call_ms=speed_ms,
                             share=fused_ms / speed_ms if speed_ms else None, goal=goal))
        del v, q, k, perm
        torch.cuda.empty_cache()
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'shape':20s} {'pass':12s} {'old ms':>8s} {'fused ms':>9s} {'graph ms':>9s} {'speed call':>10s} {'share':>7s} {'goal':>5s}"]
    for r in rows:
        share = "n/a" if r["share"] is None else f"{100 * r['share']:.1f}%"
        call = "n/a" if r["speed_call_ms"] is None else f"{r['speed_call_ms']:.2f}"
        verdict = "" if r["share"] is None else ("met" if r["share"] <= r["goal"] else "MISSED")
        lines.append(f"{r['shape']:20s} {r['passes']:12s} {r['old_ms']:8.2f} {r['fused_ms']:9.3f} {r['fused_graph_ms']:9.3f} {call:>10s} "
                     f"{share:>7s} {100 * r['goal']:4.0f}% {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=None,
                        help="time_grouping details at Wan2.2-14B 720p for these batch sizes instead of the comparison")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated subset of {', '.join(SHAPES)}")
    parser.add_argument("--clusters", type=int, default=grouping.DEFAULT_CLUSTERS)
    parser.add_argument("--iters", type=int, default=grouping.DEFAULT_ITERS)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--compare-permutations", action="store_true")
    parser.add_argument("--passes", default="tensor-cores",
                        help=f"comma-separated assignment passes to time: {', '.join(PASSES)} (one row each)")
    args = parser.parse_args(argv)
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}; "
          f"{args.clusters} clusters, {args.iters} iterations, bf16 V, median of {args.repeats}")
    if args.batch is None:
        unknown = set(args.shapes.split(",")) - set(SHAPES)
        if unknown:
            raise SystemExit(f"unknown shapes {sorted(unknown)}; choose from {', '.join(SHAPES)}")
        chosen = {name: SHAPES[name] for name in args.shapes.split(",")}
        passes = tuple(args.passes.split(","))
        if set(passes) - set(PASSES):
            raise SystemExit(f"unknown passes {sorted(set(passes) - set(PASSES))}; choose from {', '.join(PASSES)}")
        print(format_rows(compare(chosen, args.clusters, args.iters, args.repeats, passes)))
        print(f"grouping calls by path: {dict(grouping_fused.PATH_CALLS)}")
        return 0
    for b in args.batch:
        row = time_grouping(b, **WAN22_720P, clusters=args.clusters, iters=args.iters,
                            compare_permutations=args.compare_permutations)
        print(row)
    cache = labels_cache_bytes(40, 2, 1, WAN22_720P["H"], WAN22_720P["N"], args.clusters, WAN22_720P["D"], False)
    print(f"labels cache, 40 layers x CFG 2 at B1 H40 N75600: {cache / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
