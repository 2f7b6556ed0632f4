"""Candidate secondary orderings of the tokens inside each k-means cluster (emulation only).

The permutation sorts tokens by (chain-ordered) cluster id; inside a cluster they keep token order,
so a 128-row block that cuts through a big cluster holds a random sample of it and its block mean is
the cluster's mean. Sorting a cluster's tokens along one direction makes each block a slice of the
cluster: the block means follow the slices and the residual that is FP8-quantized shrinks along
that direction. The candidates cost one projection per token (plus, for "pca", a few power
iterations over the cluster's tokens) and a segmented sort; the fidelity study measures whether
that pays (bench/fidelity_study.py --grouping-sweep).

- "norm": by ||v||.
- "chain": by the projection on the chain direction c_next - c_prev (the neighbours in the cluster
  chain; one-sided at the ends), so a cluster's first rows lie toward the previous cluster and its
  last rows toward the next one, where the straddling blocks meet them.
- "chain4" / "chain8" / "chain16": "chain" with the key cut into that many equal-width bins of the cluster's
  key range, token order inside a bin: what a counting sort over (cluster, bin) buckets, the fused grouping's
  permutation with more buckets, would give instead of a sort.
- "node8" / "node16": what the node runs (kernels/grouping_within.py): the bins of "chain8" / "chain16" but
  with the grouping's own centroids as the chain's points (not its member means) and empty neighbours
  skipped; bench/fidelity_study.py takes them from grouping.group_tokens(within_bins=...), not from here.
- "pca": by the projection on the cluster's principal direction (POWER_ITERS power iterations
  started from the chain direction, oriented along it); "pca1" / "pca2": 1 or 2 power iterations,
  each one more pass over V on a GPU.
"""
from __future__ import annotations

import torch

POWER_ITERS = 6
PCA_ITERS = {"pca": POWER_ITERS, "pca1": 1, "pca2": 2}
CHAIN_BINS = {"chain4": 4, "chain8": 8, "chain16": 16}
NODE_BINS = {"node8": 8, "node16": 16}  # the node's within-cluster kernel (kernels/grouping_within.py)
ORDERS = ("none", "norm", "chain", *CHAIN_BINS, *NODE_BINS, *PCA_ITERS)


def cluster_means(x: torch.Tensor, labels: torch.Tensor, clusters: int) -> torch.Tensor:
    """(B,H,C,D) float32 member means (zero for an empty cluster)."""
    b, h, n, d = x.shape
    sums = x.new_zeros(b, h, clusters, d).scatter_add_(2, labels.unsqueeze(-1).expand(b, h, n, d), x)
    counts = x.new_zeros(b, h, clusters).scatter_add_(2, labels, x.new_ones(b, h, n))
    return sums / counts.clamp(min=1).unsqueeze(-1)


def chain_directions(means: torch.Tensor) -> torch.Tensor:
    """c_{i+1} - c_{i-1} along the cluster ids (one-sided at the ends), (B,H,C,D)."""
    nxt = torch.cat([means[:, :, 1:], means[:, :, -1:]], dim=2)
    prv = torch.cat([means[:, :, :1], means[:, :, :-1]], dim=2)
    return nxt - prv


def principal_directions(x: torch.Tensor, labels: torch.Tensor, means: torch.Tensor, start: torch.Tensor,
                         iters: int = POWER_ITERS) -> torch.Tensor:
    """Top eigenvector of each cluster's covariance by `iters` power iterations from `start`, oriented along it."""
    b, h, n, d = x.shape
    centred = x - torch.gather(means, 2, labels.unsqueeze(-1).expand(b, h, n, d))
    u = start / start.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    for _ in range(iters):
        proj = (centred * torch.gather(u, 2, labels.unsqueeze(-1).expand(b, h, n, d))).sum(-1, keepdim=True)
        u = torch.zeros_like(means).scatter_add_(2, labels.unsqueeze(-1).expand(b, h, n, d), proj * centred)
        u = u / u.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    sign = torch.where((u * start).sum(-1, keepdim=True) < 0, -1.0, 1.0)
    return u * sign


def secondary_key(v: torch.Tensor, labels: torch.Tensor, clusters: int, order: str) -> torch.Tensor:
    """(B,H,N) float32 key that orders the tokens inside their cluster."""
    x = v.float()
    if order == "norm":
        return x.norm(dim=-1)
    means = cluster_means(x, labels, clusters)
    direction = chain_directions(means)
    if order in PCA_ITERS:
        direction = principal_directions(x, labels, means, direction, PCA_ITERS[order])
    elif order in NODE_BINS:
        raise ValueError(f"order {order!r} is the node's: take it from grouping.group_tokens(within_bins="
                         f"{NODE_BINS[order]}), which has the centroids it needs.")
    elif order != "chain" and order not in CHAIN_BINS:
        raise ValueError(f"within-cluster order must be one of {ORDERS}, got {order!r}.")
    b, h, n, d = x.shape
    key = (x * torch.gather(direction, 2, labels.unsqueeze(-1).expand(b, h, n, d))).sum(-1)
    if order in CHAIN_BINS:
        return binned(key, labels, clusters, CHAIN_BINS[order])
    return key


def binned(key: torch.Tensor, labels: torch.Tensor, clusters: int, bins: int) -> torch.Tensor:
    """The bin index (as float32) of each key among `bins` equal-width bins of its cluster's key range."""
    shape, labels = (*key.shape[:-1], clusters), labels.long()
    lo = torch.full(shape, float("inf"), device=key.device).scatter_reduce(-1, labels, key, "amin")
    hi = torch.full(shape, float("-inf"), device=key.device).scatter_reduce(-1, labels, key, "amax")
    lo_t, hi_t = torch.gather(lo, -1, labels), torch.gather(hi, -1, labels)
    frac = (key - lo_t) / (hi_t - lo_t).clamp(min=1e-30)
    return torch.clamp(torch.floor(frac * bins), 0, bins - 1)


def permutation(v: torch.Tensor, labels: torch.Tensor, clusters: int, order: str) -> torch.Tensor:
    """perm (B,H,N): tokens sorted by label, inside a label by the secondary key ("none": token order)."""
    labels = labels.long()
    if order == "none":
        return torch.argsort(labels, dim=-1, stable=True)
    first = torch.argsort(secondary_key(v, labels, clusters, order), dim=-1, stable=True)
    second = torch.argsort(torch.gather(labels, -1, first), dim=-1, stable=True)
    return torch.gather(first, -1, second)
