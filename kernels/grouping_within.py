"""The within-cluster order of V-Smooth's grouping: each cluster's tokens in bins along its chain direction.

The permutation sorts tokens by (chain-ordered) cluster id. Inside a cluster they used to keep token
order, so a 128-row block that cuts through a big cluster held a random sample of it and its block mean
was the cluster's mean. Here each cluster's tokens are cut into `bins` equal-width bins of their
projection on the cluster's chain direction c_next - c_prev (the neighbouring ids of the chain order,
whose clusters are the nearest ones): a block then holds a slice of its cluster, the slice's mean
follows it, and the FP8 residual of V shrinks along that direction. On the video-like data, emulated,
8 bins keep the whole gain of a full sort by the projection at 32,760 tokens and 16 most of it at
75,600 (docs/fidelity-study.md, "The within-cluster chain order as bins of a counting sort").

Why bins and not a sort: only the 128-row block a token lands in matters, and a counting sort over
(cluster, bin) buckets is one kernel (csrc/grouping_refine.cuh) where a segmented sort per head is not.

This module is the spec (torch, any device) and the dispatcher to the fused kernel
(grouping_fused.refine_perm). Semantics, all in float32:
- the centroids are the grouping's fp16 centroids in the chain ids (CompactGrouping.centroids);
- neighbours are the ids r - 1 and r + 1 when they hold tokens, else r itself (one-sided at the chain's
  ends; the chain puts empty clusters last), so direction_r = c_next - c_prev (zero for a lone cluster);
- key_t = v_t . direction_{label_t}; per cluster lo = min, hi = max of its keys (NaN keys left out);
- with width = hi - lo finite and > 0: f = (key - lo) * (bins / width), bin = min(bins - 1, floor(f)) for
  f >= 0, else 0 (a NaN key: bin 0); otherwise every token of the cluster is in bin 0;
- the permutation is the stable sort by (label, bin): token order inside a bin.
The kernel sums the dot product in another order than torch, so a key within float rounding of a bin
edge may land in the neighbouring bin there (any permutation of K and V together is exact; only the
fidelity gain depends on the bins).
"""
from __future__ import annotations

import torch

MAX_BINS = 32  # csrc/grouping_params.h kGroupMaxWithinBins: per-block shared-memory counters


def check_bins(bins: int) -> None:
    if isinstance(bins, bool) or not isinstance(bins, int) or not 0 <= bins <= MAX_BINS:
        raise ValueError(f"within-cluster bins must be an integer from 0 (token order) to {MAX_BINS}, got {bins!r}.")


def chain_directions(centroids: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(B,H,C,D) float32 c_next - c_prev of each cluster in the chain ids (see the module docstring)."""
    c = centroids.float()
    clusters = c.shape[-2]
    present = counts > 0
    ids = torch.arange(clusters, device=c.device)
    nxt = torch.minimum(ids + 1, torch.tensor(clusters - 1, device=c.device)).expand_as(counts)
    prv = torch.clamp(ids - 1, min=0).expand_as(counts)
    nxt = torch.where(torch.gather(present, -1, nxt) & (ids + 1 < clusters), nxt, ids.expand_as(counts))
    prv = torch.where(torch.gather(present, -1, prv) & (ids > 0), prv, ids.expand_as(counts))
    d = c.shape[-1]
    return (torch.gather(c, -2, nxt.unsqueeze(-1).expand(*nxt.shape, d))
            - torch.gather(c, -2, prv.unsqueeze(-1).expand(*prv.shape, d)))


def token_bins(v: torch.Tensor, labels: torch.Tensor, counts: torch.Tensor, centroids: torch.Tensor,
               bins: int) -> torch.Tensor:
    """(B,H,N) int64 bin of every token inside its cluster (the module docstring's rule)."""
    check_bins(bins)
    labels = labels.long()
    if bins <= 1:
        return torch.zeros_like(labels)
    direction = chain_directions(centroids, counts)
    b, h, n, d = v.shape
    keys = torch.empty(b, h, n, dtype=torch.float32, device=v.device)
    for i in range(b):  # per (batch, head): the gathered directions are N x D float32
        for j in range(h):
            keys[i, j] = (v[i, j].float() * direction[i, j][labels[i, j]]).sum(-1)
    shape = (b, h, counts.shape[-1])
    nan = torch.isnan(keys)  # a NaN key sets no range (as fminf / fmaxf in the kernel)
    lo = torch.full(shape, float("inf"), device=v.device).scatter_reduce(
        -1, labels, torch.where(nan, float("inf"), keys), "amin")
    hi = torch.full(shape, float("-inf"), device=v.device).scatter_reduce(
        -1, labels, torch.where(nan, float("-inf"), keys), "amax")
    width = hi - lo
    valid = (width > 0) & torch.isfinite(width)
    scale = torch.where(valid, torch.tensor(float(bins), device=v.device) / torch.where(valid, width, 1.0), 0.0)
    f = (keys - torch.gather(lo, -1, labels)) * torch.gather(scale, -1, labels)
    binned = torch.where(f >= 0, torch.clamp(torch.floor(torch.where(f >= 0, f, 0.0)), max=bins - 1), 0.0)
    return torch.where(torch.gather(valid, -1, labels), binned, 0.0).long()


def within_perm(v: torch.Tensor, labels: torch.Tensor, counts: torch.Tensor, centroids: torch.Tensor,
                bins: int) -> torch.Tensor:
    """(B,H,N) int32 stable sort of the tokens by (label, bin): the spec's permutation (torch)."""
    key = labels.long() * max(bins, 1) + token_bins(v, labels, counts, centroids, bins)
    return torch.sort(key, dim=-1, stable=True).indices.to(torch.int32)
