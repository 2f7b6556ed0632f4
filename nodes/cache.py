"""Per-layer cache of V-Smooth groupings for one sampling run.

Key: (block type, block index or call order, nth eligible call of that block in this forward,
cond/uncond branches of the batch, token count, batch size). Models that report
transformer_options["block_index"] (Wan, HunyuanVideo, Flux-style models) give stable keys; for
the others (LTX-Video) the order of the eligible calls within one forward stands in for the index.
A key that names the wrong layer can only cost fidelity, never correctness: any permutation of K
and V together leaves the attention output unchanged, and the key's N and B make the shape match.

What is stored is kernels.grouping.CompactGrouping: labels (1 byte per token with <= 256 clusters)
+ counts, and the centroids only while the grouping window may still warm-start from them, as E4M3
codes with a float32 scale per centroid (CompactGrouping.compact_centroids: a warm start only seeds
the next step's first assignment). A grouping with within-cluster bins (Settings.within_bins,
kernels/grouping_within.py) keeps its centroids for the whole run: each reuse step bins its tokens
from that step's V along the centroids' chain; the bound below already counts the centroids.
Memory for Wan2.2-14B at 720p with CFG (40 blocks, 40 heads, N = 75,600, cond and uncond): labels
40 * 2 * 40 * 75,600 B = 242 MB; int32 counts (64 clusters) 40 * 2 * 40 * 64 * 4 B = 0.8 MB;
centroids while inside the window (D = 128): 40 * 2 * 40 * 64 * (128 + 4) B = 27 MB; together
270 MB (estimated_bytes, tested), and 243 MB after the window. With the fidelity preset's 128
clusters: 298 MB inside the window (fp16 centroids would make it 348 MB).
(int32 permutations instead of labels would be 968 MB.) Everything is freed when the run ends.

Within a run the cache holds one entry per layer and branch: a new entry replaces every entry of
the same layer (block, nth call) whose branches overlap its own. So when ComfyUI switches between
batching cond and uncond together and one forward each (it does when memory is short), or the
token count or batch size changes, the old entries go (counted as evictions in the run's stats)
instead of the cache doubling or growing with every resolution.
"""
from __future__ import annotations

from typing import Hashable, NamedTuple, Optional

from ..kernels.grouping import CompactGrouping


class LayerKey(NamedTuple):
    block: Hashable  # (block type, block index) or ("call", order in the forward)
    nth: int  # nth eligible call of that block in this forward
    branches: tuple  # cond_or_uncond of the batch, e.g. (0, 1)
    tokens: int
    batch: int

    def replaces(self, other: "LayerKey") -> bool:
        """Same layer, overlapping branches (or both unknown), and not the same key."""
        same_branch = bool(set(self.branches) & set(other.branches)) or self.branches == other.branches
        return (self.block, self.nth) == (other.block, other.nth) and same_branch and self != other


class GroupingCache:
    def __init__(self) -> None:
        self._entries: dict[LayerKey, CompactGrouping] = {}

    def get(self, key: LayerKey) -> Optional[CompactGrouping]:
        return self._entries.get(key)

    def put(self, key: LayerKey, grouping: CompactGrouping) -> int:
        """Store `grouping`, dropping the entries it replaces (LayerKey.replaces); returns how many."""
        stale = [old for old in self._entries if key.replaces(old)]
        for old in stale:
            del self._entries[old]
        self._entries[key] = grouping.compact_centroids()
        return len(stale)

    def drop_centroids(self) -> None:
        """Past the grouping window nothing warm-starts any more: keep labels and counts only."""
        for grouping in self._entries.values():
            grouping.drop_centroids()

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self._entries.values())


def estimated_bytes(
    blocks: int, branches: int, heads: int, tokens: int, head_dim: int, clusters: int, with_centroids: bool
) -> int:
    """Cache size for `blocks` layers x `branches` (cond/uncond) at batch 1, as CompactGrouping stores it."""
    label_bytes = 1 if clusters <= 256 else 2
    # centroids as the cache keeps them (CompactGrouping.compact_centroids): E4M3 codes + a float32 scale
    per_head = tokens * label_bytes + clusters * 4 + (clusters * (head_dim + 4) if with_centroids else 0)
    return blocks * branches * heads * per_head


# Wan2.2-T2V-A14B, 1280x720, 81 frames, CFG: the figure quoted in the module docstring.
WAN22_14B_720P_CFG = dict(blocks=40, branches=2, heads=40, tokens=75_600, head_dim=128)
