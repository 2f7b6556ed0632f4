"""Per-layer cache of V-Smooth groupings for one sampling run.

Key: (block type, block index or call order, nth eligible call of that block in this forward,
cond/uncond branches of the batch, token count, batch size). Models that report
transformer_options["block_index"] (Wan, HunyuanVideo, Flux-style models) give stable keys; for
the others (LTX-Video) the order of the eligible calls within one forward stands in for the index.
A key that names the wrong layer can only cost fidelity, never correctness: any permutation of K
and V together leaves the attention output unchanged, and the key's N and B make the shape match.

What is stored is kernels.grouping.CompactGrouping: labels (1 byte per token with <= 256 clusters)
+ counts, and fp16 centroids only while the grouping window may still warm-start from them.
Memory for Wan2.2-14B at 720p with CFG (40 blocks, 40 heads, N = 75,600, cond and uncond): labels
40 * 2 * 40 * 75,600 B = 242 MB; int32 counts (64 clusters) 40 * 2 * 40 * 64 * 4 B = 0.8 MB;
centroids while inside the window (D = 128, fp16): 40 * 2 * 40 * 64 * 128 * 2 B = 52 MB; together
295 MB (estimated_bytes, tested), and 243 MB after the window.
(int32 permutations instead of labels would be 968 MB.) Everything is freed when the run ends.
"""
from __future__ import annotations

from typing import Hashable, Optional

from ..kernels.grouping import CompactGrouping


class GroupingCache:
    def __init__(self) -> None:
        self._entries: dict[Hashable, CompactGrouping] = {}

    def get(self, key: Hashable) -> Optional[CompactGrouping]:
        return self._entries.get(key)

    def put(self, key: Hashable, grouping: CompactGrouping) -> None:
        self._entries[key] = grouping

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
    per_head = tokens * label_bytes + clusters * 4 + (clusters * head_dim * 2 if with_centroids else 0)
    return blocks * branches * heads * per_head


# Wan2.2-T2V-A14B, 1280x720, 81 frames, CFG: the figure quoted in the module docstring.
WAN22_14B_720P_CFG = dict(blocks=40, branches=2, heads=40, tokens=75_600, head_dim=128)
