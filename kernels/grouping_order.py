"""Cluster ordering for V-Smooth: number the k-means clusters so that neighbours in id are neighbours
in value space.

The permutation sorts tokens by cluster id and V-Smooth then subtracts one mean per 128-row block.
Clusters are not multiples of 128 tokens, so many blocks straddle two or more clusters; with
arbitrary ids those are unrelated clusters and the block mean fits none of them (more clusters, more
such blocks: that is why plain k-means gets WORSE past a few dozen clusters). Renumbering the
clusters along a nearest-neighbour chain of their centroids makes a straddling block mix similar
clusters. It renames labels only: the labels stay a k-means partition, equal to the reference's up
to cluster-id renaming, and the permutation is still the stable sort by (renamed) label.

Batched over all (batch, head) groups: C steps of four small kernels each, no host synchronization
(capturable in a CUDA graph, where the launch cost disappears).
"""
from __future__ import annotations

import torch

_UNREACHED = 3.0e38  # "distance" to an empty cluster: below inf, above any real distance


def chain_ranks(centroids: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Greedy nearest-neighbour chain through the non-empty clusters of each group.

    centroids (G,C,D) float32, counts (G,C). The chain starts at the cluster farthest from the
    count-weighted mean (an end of the cloud, so the chain does not have to double back) and always
    steps to the nearest cluster not yet visited; empty clusters go last. Returns rank (G,C) int64:
    rank[g, c] = the new id of cluster c.
    """
    g, c, _ = centroids.shape
    present = counts > 0
    weights = counts.float().unsqueeze(-1)
    mean = (centroids * weights).sum(1, keepdim=True) / weights.sum(1, keepdim=True).clamp(min=1.0)
    spread = (centroids - mean).square().sum(-1).masked_fill(~present, -1.0)
    # squared distances by products (C is small); an empty cluster is farther than any real one but
    # finite, so the walk reaches it only when no non-empty cluster is left
    norms = centroids.square().sum(-1)
    dist = norms.unsqueeze(-1) + norms.unsqueeze(-2) - 2.0 * centroids @ centroids.transpose(1, 2)
    dist = dist.masked_fill(~present.unsqueeze(-2), _UNREACHED)

    rank = torch.zeros(g, c, dtype=torch.int64, device=centroids.device)  # the start keeps rank 0
    current = spread.argmax(-1, keepdim=True)  # (G,1)
    for step in range(1, c):
        # nobody steps to `current` again: its column becomes +inf
        dist.scatter_(2, current.unsqueeze(1).expand(g, c, 1), float("inf"))
        row = torch.gather(dist, 1, current.unsqueeze(-1).expand(g, 1, c)).squeeze(1)
        current = row.argmin(-1, keepdim=True)
        rank.scatter_(1, current, step)
    return rank
