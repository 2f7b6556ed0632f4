"""V-Smooth token grouping at speed: batched k-means, O(N) permutation, a compact label cache.

On CUDA with fp16/bf16 V, head dim 64/128 and <= 256 clusters, `kmeans` and `group_tokens` run the
fused kernels of grouping_fused.py (one launch per pass for all heads, order and permutation on the
GPU). Everything else, and every CPU call, runs the torch implementation below; each call is
counted in grouping_fused.PATH_CALLS with the reason.

The torch implementation reproduces the semantics of reference.kmeans_labels /
labels_to_permutation (labels equal up to near-ties and float summation order) with every
(batch, head) processed at once through batched matrix products, and without any host
synchronization (no .item(), no nonzero, no shape that depends on data), so the whole grouping can
be captured in a CUDA graph.

Precision: fp32 inputs (and every CPU input) run in float32, like the reference. fp16/bf16 inputs on
CUDA stay in their own dtype (so V is read exactly), centroids are rounded to that dtype for the
distance product, and both products accumulate and return float32 (`out_dtype`), so tensor cores do
the work. Rounding a centroid to 16 bits moves it by < 2^-8 of its size: one assignment is then
exact for the rounded centroids, and over several iterations near-tie flips move 0.5-2% of the
labels of the float32 reference with the same clustering quality (docs/grouping.md).

Memory traffic, not arithmetic, is the cost on a GPU: per iteration one (N x C) float32 score matrix
written and read once (the centroid norms ride inside the product, see _augment), and one 16-bit
one-hot matrix for the update (the cluster counts ride inside that product too).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional

import torch

from . import constants, grouping_fused, grouping_within, jit, reference
from .grouping_order import chain_ranks

# Chosen by measurement on video-like data (bench/grouping_sweep.py, docs/grouping.md).
DEFAULT_CLUSTERS = 64
DEFAULT_ITERS = 2
# The within-cluster order every grouping takes unless told otherwise (kernels/grouping_within.py): 0 keeps
# token order inside a cluster. Emulated, 8 bins lower the rel-L2 by 2-3% in every preset's grouping
# (docs/fidelity-study.md); it becomes 8 once the H200 shows the same on the real kernels at no speed cost
# (bench/grouping_fidelity_gpu.py --kernel-bins 8; its kernel has not run on a GPU yet).
DEFAULT_WITHIN_BINS = 0

MAX_CLUSTERS = 32768  # labels must fit int16
FP16_MAX = 65504.0

# Per-chunk budget for the per-head temporaries: scores, the one-hot matrix and the augmented V.
_TEMP_BYTES = 1 << 30


@functools.lru_cache(maxsize=None)
def _has_out_dtype(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether 16-bit batched products with a float32 result (aten::bmm.dtype, torch >= 2.8) run on
    this device; probed once with a tiny product so an older torch falls back to float32."""
    if not hasattr(torch.ops.aten.bmm, "dtype"):
        return False
    probe = torch.ones(1, 8, 8, dtype=dtype, device=device)
    try:
        return torch.bmm(probe, probe, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, NotImplementedError):
        return False


def label_dtype(clusters: int) -> torch.dtype:
    """The compact label dtype: uint8 up to 256 clusters, int16 beyond."""
    return torch.uint8 if clusters <= 256 else torch.int16


def _check_args(v: torch.Tensor, clusters: int, iters: int) -> None:
    if v.dim() != 4:
        raise ValueError(f"grouping expects V as a 4-D (B, H, N, D) tensor, got shape {tuple(v.shape)}.")
    if v.shape[2] < 1:
        raise ValueError("grouping needs at least one token (N >= 1).")
    if not 1 <= clusters <= MAX_CLUSTERS:
        raise ValueError(f"clusters must be between 1 and {MAX_CLUSTERS}, got {clusters}.")
    if iters < 0:
        raise ValueError(f"iters must be >= 0, got {iters}.")


def _work_dtype(v: torch.Tensor) -> torch.dtype:
    """The dtype the products read V in (see the module docstring)."""
    if v.is_cuda and v.dtype in (torch.float16, torch.bfloat16) and _has_out_dtype(v.device, v.dtype):
        return v.dtype
    return torch.float32


def _bmm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched a @ b with a float32 result; 16-bit operands: exact products, float32 accumulation
    (tensor cores on CUDA; an exact float32 emulation elsewhere, which the CPU tests use)."""
    if a.dtype == torch.float32:
        return torch.bmm(a, b)
    if a.is_cuda and _has_out_dtype(a.device, a.dtype):
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())


@functools.lru_cache(maxsize=64)
def _init_indices(n: int, clusters: int, seed: int, device: torch.device) -> torch.Tensor:
    """reference.kmeans_init_indices, cached on the device: a CUDA-graph capture after one warm-up
    call then does no host-to-device copy."""
    return reference.kmeans_init_indices(n, clusters, seed).to(device)


# The distance product carries the centroid norm in extra columns: x_aug = [x, a, a, a, 0..] and
# c_aug = [-c, t1, t2, t3, 0..] with t1 + t2 + t3 = ||c||^2 / (2a), so x_aug . c_aug =
# ||c||^2/2 - x.c, whose argmin is kmeans_assign's, in ONE product with no pass over the scores to
# add the norms. In 16 bits the norm needs three terms to keep float32's 24 bits; float32 needs one.
# `a` is a power of two per (batch, head): 1, except in fp16 where it keeps t1 <= 2^14 (inside fp16's
# range) for any centroid no longer than the longest token. The same column sums to a * count in
# the update product, so the cluster counts come for free.
_FP16_NORM_TARGET = 2.0**15


def _augment(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(G,N,D) -> x_aug (G,N,D') = [x, a.., 0..] (D' a multiple of 8 in 16 bits, for tensor-core
    alignment) and a (G,1,1) float32, the norm column's power of two (see above)."""
    g, n, d = x.shape
    terms = 1 if x.dtype == torch.float32 else 3
    if x.dtype == torch.float16:
        # a centroid is a mean of tokens, so ||c||^2 <= the largest ||x||^2 of its (batch, head)
        longest = x.float().square().sum(-1).amax(-1).clamp(min=1e-30)
        a = torch.exp2(torch.ceil(torch.log2(longest / _FP16_NORM_TARGET))).clamp(2.0**-14, 2.0**15)
    else:
        a = torch.ones(g, device=x.device)
    a = a.view(g, 1, 1)
    width = d + terms if x.dtype == torch.float32 else (d + terms + 7) // 8 * 8
    x_aug = torch.zeros(g, n, width, dtype=x.dtype, device=x.device)
    x_aug[..., :d] = x
    x_aug[..., d : d + terms] = a.to(x.dtype)
    return x_aug, a


def _centroid_operand(centroids: torch.Tensor, x_aug: torch.Tensor, a: torch.Tensor, d: int) -> torch.Tensor:
    """(G,C,D) float32 centroids -> (G,C,D') [-c, norm terms, 0..] in x_aug's dtype (see above).

    The centroids are rounded to the work dtype first and the norm taken from the rounded values,
    so the argmin is exact for the centroids the product actually uses.
    """
    terms = 1 if x_aug.dtype == torch.float32 else 3
    c = centroids.to(x_aug.dtype)
    rest = c.float().square().sum(-1) / (2.0 * a.view(-1, 1))
    c_aug = torch.zeros(*c.shape[:-1], x_aug.shape[-1], dtype=x_aug.dtype, device=x_aug.device)
    c_aug[..., :d] = -c
    for t in range(terms):
        term = rest.clamp(max=FP16_MAX).to(x_aug.dtype) if x_aug.dtype == torch.float16 else rest.to(x_aug.dtype)
        c_aug[..., d + t] = term
        rest = rest - term.float()
    return c_aug


def _assign(x_aug: torch.Tensor, a: torch.Tensor, centroids: torch.Tensor, d: int) -> torch.Tensor:
    """Nearest centroid by squared Euclidean distance, ties to the lowest id (as kmeans_assign)."""
    score = _bmm_f32(x_aug, _centroid_operand(centroids, x_aug, a, d).transpose(1, 2))
    return score.argmin(dim=-1)


def _cluster_sums_onehot(x_aug: torch.Tensor, labels: torch.Tensor, clusters: int) -> torch.Tensor:
    """Per-cluster sums of x_aug's rows as one batched product with a one-hot (G,C,N) matrix.

    Deterministic and tensor-core friendly (no atomics, exact 0/1 weights, float32 accumulation):
    the CUDA path. Returns (G,C,D') float32.
    """
    g, n, _ = x_aug.shape
    onehot = torch.zeros(g, clusters, n, dtype=x_aug.dtype, device=x_aug.device)
    onehot.scatter_(1, labels.unsqueeze(1), 1.0)
    return _bmm_f32(onehot, x_aug)


def _cluster_sums_scatter(x_aug: torch.Tensor, labels: torch.Tensor, clusters: int) -> torch.Tensor:
    """Per-cluster sums of x_aug's rows by scatter-add, O(N D): the CPU path (as kmeans_update)."""
    g, n, width = x_aug.shape
    sums = torch.zeros(g, clusters, width, dtype=torch.float32, device=x_aug.device)
    return sums.scatter_add_(1, labels.unsqueeze(-1).expand(g, n, width), x_aug.float())


def _update(
    x_aug: torch.Tensor, a: torch.Tensor, labels: torch.Tensor, centroids: torch.Tensor, d: int
) -> torch.Tensor:
    """Cluster means; an empty cluster keeps its previous centroid (as kmeans_update)."""
    sums_of = _cluster_sums_onehot if x_aug.is_cuda else _cluster_sums_scatter
    sums = sums_of(x_aug, labels, centroids.shape[1])
    counts = sums[..., d : d + 1] / a
    return torch.where(counts > 0, sums[..., :d] / counts.clamp(min=1.0), centroids)


def _lloyd(x: torch.Tensor, centroids: torch.Tensor, iters: int) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.shape[-1]
    x_aug, a = _augment(x)
    for _ in range(iters):
        centroids = _update(x_aug, a, _assign(x_aug, a, centroids, d), centroids, d)
    return _assign(x_aug, a, centroids, d), centroids


def _heads_per_chunk(groups: int, n: int, clusters: int, d: int) -> int:
    per_head = n * (clusters * 8 + (d + 8) * 4)  # float32 scores, one-hot rows, x_aug
    return max(1, min(groups, _TEMP_BYTES // per_head))


def kmeans(
    v_bhnd: torch.Tensor,
    clusters: int,
    iters: int,
    seed: int = 0,
    init_centroids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd k-means over the value tokens of every (b, h): the semantics of reference.kmeans_labels.

    v_bhnd: (B,H,N,D), any float dtype and strides. Init: the tokens reference.kmeans_init_indices
    (N, clusters, seed) (clusters capped at N), or `init_centroids` (B,H,C,D) for a warm start.
    `iters` rounds of assign + update, then a final assignment, so labels match the centroids.
    Returns (labels int64 (B,H,N), centroids float32 (B,H,C,D)).
    """
    _check_args(v_bhnd, clusters, iters)
    fused = _fused(v_bhnd, clusters, iters, seed, init_centroids, order=None)
    if fused is not None:
        return fused["raw_labels"].long(), fused["centroids"]
    return _torch_kmeans(v_bhnd, clusters, iters, seed, init_centroids)


def _initial_centroids(
    v_bhnd: torch.Tensor, clusters: int, seed: int, init_centroids: Optional[torch.Tensor]
) -> torch.Tensor:
    """(B,H,C,D) float32, a private copy: the seeded init tokens or the warm-start centroids."""
    b, h, n, d = v_bhnd.shape
    c = min(clusters, n)
    if init_centroids is None:
        return v_bhnd.index_select(2, _init_indices(n, clusters, seed, v_bhnd.device)).float()
    if tuple(init_centroids.shape) != (b, h, c, d):
        raise ValueError(
            f"init_centroids must have shape (B, H, C, D) = {(b, h, c, d)}, got {tuple(init_centroids.shape)}: "
            "a warm start needs the same batch, heads, cluster count and head dim."
        )
    return init_centroids.to(device=v_bhnd.device, dtype=torch.float32, copy=True).contiguous()


def _fused_or_counted(reason_of, run, tensor: torch.Tensor):
    """run() when reason_of() says the fused kernels can take the call, else None after counting why
    (a build failure disables the fused path for the process and is counted as its reason)."""
    reason = reason_of()
    if reason is None:
        try:
            return run()
        except jit.JitError as err:  # no working toolchain: the torch path for the rest of the process
            grouping_fused.disable(str(err))
            reason = reason_of()
    grouping_fused.count_fallback(tensor, reason)
    return None


def _fused(v_bhnd, clusters, iters, seed, init_centroids, order: Optional[bool]) -> Optional[dict]:
    """The fused CUDA grouping (grouping_fused.run), or None after counting why it cannot run."""
    return _fused_or_counted(
        lambda: grouping_fused.unsupported_reason(v_bhnd, clusters),
        lambda: grouping_fused.run(v_bhnd, _initial_centroids(v_bhnd, clusters, seed, init_centroids), iters, order),
        v_bhnd)


def _torch_kmeans(v_bhnd, clusters, iters, seed, init_centroids) -> tuple[torch.Tensor, torch.Tensor]:
    """kmeans on the torch path: batched products (see the module docstring)."""
    b, h, n, d = v_bhnd.shape
    c = min(clusters, n)
    x = v_bhnd.flatten(0, 1).to(_work_dtype(v_bhnd))  # a view for B == 1 in either layout
    centroids = _initial_centroids(v_bhnd, clusters, seed, init_centroids).view(b * h, c, d)

    step = _heads_per_chunk(b * h, n, c, d)
    parts = [_lloyd(x[i : i + step], centroids[i : i + step], iters) for i in range(0, b * h, step)]
    labels = torch.cat([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    centroids = torch.cat([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    return labels.view(b, h, n), centroids.view(b, h, c, d)


def permutation_from_labels(labels: torch.Tensor, clusters: int) -> torch.Tensor:
    """Stable sort of the tokens by label (ties keep token order), as reference.labels_to_permutation.

    The labels are sorted as uint8 / int16 keys: on CUDA torch's stable sort is a CUB radix sort
    whose passes are one per key byte, so with <= 256 clusters it is ONE counting-sort pass, O(N) per
    head with no (N x clusters) temporary. Returns perm (B,H,N) int32: perm[i] = source token of slot i.
    """
    if not 1 <= clusters <= MAX_CLUSTERS:
        raise ValueError(f"clusters must be between 1 and {MAX_CLUSTERS}, got {clusters}.")
    keys = labels.to(label_dtype(clusters))
    return torch.sort(keys, dim=-1, stable=True).indices.to(torch.int32)


def _cluster_counts(labels: torch.Tensor, clusters: int) -> torch.Tensor:
    """(B,H,N) labels -> (B,H,C) int32 tokens per cluster (integer adds: deterministic)."""
    counts = torch.zeros(*labels.shape[:-1], clusters, dtype=torch.int32, device=labels.device)
    return counts.scatter_add_(-1, labels, torch.ones_like(labels, dtype=torch.int32))


@dataclass
class CompactGrouping:
    """One layer's grouping as the cache keeps it: 1-2 bytes per token instead of a 4-byte perm.

    labels: (B,H,N) uint8 (clusters <= 256) or int16. counts: (B,H,C) int32 tokens per cluster.
    centroids: (B,H,C,D) fp16, kept only while later grouping steps may warm-start from them; after
    compact_centroids() (the node's cache calls it) E4M3 codes with one float32 scale per centroid in
    centroid_scale (B,H,C,1): D + 4 bytes a centroid instead of 2 D.
    within_bins: with >= 2, each cluster's tokens are in that many bins along its chain direction
    (kernels/grouping_within.py); the bins are not stored: every perm(v) recomputes them from the V of
    its call and the centroids, which such a grouping therefore keeps (drop_centroids() leaves them).
    """

    labels: torch.Tensor
    counts: torch.Tensor
    centroids: torch.Tensor | None = None
    centroid_scale: torch.Tensor | None = None
    within_bins: int = 0
    # the fused path's permutation, handed out by the first perm() and then dropped, so a cached
    # grouping keeps 1 byte a token, not 5
    fresh_perm: torch.Tensor | None = field(default=None, repr=False)

    @property
    def clusters(self) -> int:
        return self.counts.shape[-1]

    def perm(self, v_bhnd: torch.Tensor | None = None) -> torch.Tensor:
        """(B,H,N) int32 permutation of the key/value tokens (stable by label; with within_bins, by label
        and bin, the bins taken from `v_bhnd`, the V of this call, which such a grouping then needs).

        A cached grouping on CUDA (the reuse steps) sorts its labels with the fused label-count and
        permutation kernels (grouping_fused.permute_labels: two launches; torch's stable sort took
        ~155 us of small launches at Wan2.1-1.3B with CFG); elsewhere torch's sort, counted with why.
        """
        if self.fresh_perm is not None:
            perm, self.fresh_perm = self.fresh_perm, None
            return perm
        if self.within_bins >= 2:
            if v_bhnd is None:
                raise ValueError("this grouping orders tokens inside their clusters (within_bins="
                                 f"{self.within_bins}): perm(v) needs the V of the call.")
            return within_cluster_perm(v_bhnd, self.labels, self.counts, self.warm_centroids(), self.within_bins)
        return self._label_perm()

    def _label_perm(self) -> torch.Tensor:
        perm = _fused_or_counted(lambda: grouping_fused.labels_unsupported_reason(self.labels, self.clusters),
                                 lambda: grouping_fused.permute_labels(self.labels, self.clusters), self.labels)
        return perm if perm is not None else permutation_from_labels(self.labels, self.clusters)

    @property
    def nbytes(self) -> int:
        tensors = [t for t in (self.labels, self.counts, self.centroids, self.centroid_scale) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def has_centroids(self) -> bool:
        return self.centroids is not None

    def warm_centroids(self) -> torch.Tensor | None:
        """(B,H,C,D) float32 centroids to warm-start the next grouping from (decoded if compacted)."""
        if self.centroids is None:
            return None
        if self.centroid_scale is None:
            return self.centroids.float()
        return self.centroids.float() * self.centroid_scale

    def compact_centroids(self) -> "CompactGrouping":
        """Keep the centroids as E4M3 codes scaled per centroid (amax -> 448); returns self.

        Why: a warm start only seeds the first assignment of the next step (its update and final
        assignment use freshly summed float32 centroids), so 3 mantissa bits are enough there, and
        they halve the centroids' share of the node's cache: 128 clusters fit the 300 MB bound at
        Wan2.2-14B 720p with CFG (nodes/cache.py). Idempotent.
        """
        if self.centroids is None or self.centroid_scale is not None:
            return self
        c = self.centroids.float()
        scale = c.abs().amax(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny) / constants.E4M3_MAX
        self.centroids = (c / scale).to(torch.float8_e4m3fn)
        self.centroid_scale = scale
        return self

    def drop_centroids(self) -> "CompactGrouping":
        """Free the centroids (after the grouping window) unless the within-cluster order needs them on
        every reuse step; returns self so the call can chain."""
        if self.within_bins >= 2:
            return self
        self.centroids = None
        self.centroid_scale = None
        return self


def within_cluster_perm(v_bhnd: torch.Tensor, labels: torch.Tensor, counts: torch.Tensor, centroids: torch.Tensor,
                        bins: int) -> torch.Tensor:
    """(B,H,N) int32 stable sort of the tokens by (label, bin along the cluster's chain direction): the fused
    label sort + the within-cluster kernel on CUDA, kernels/grouping_within.within_perm elsewhere (counted)."""
    grouping_within.check_bins(bins)

    def fused():
        label_perm = grouping_fused.permute_labels(labels, counts.shape[-1])
        return grouping_fused.refine_perm(v_bhnd, label_perm, counts, centroids, bins)

    perm = _fused_or_counted(lambda: (grouping_fused.unsupported_reason(v_bhnd, counts.shape[-1])
                                      or grouping_fused.labels_unsupported_reason(labels, counts.shape[-1])),
                             fused, v_bhnd)
    return perm if perm is not None else grouping_within.within_perm(v_bhnd, labels, counts, centroids, bins)


def group_tokens(
    v_bhnd: torch.Tensor,
    clusters: int,
    iters: int,
    seed: int = 0,
    warm_start: CompactGrouping | None = None,
    order_clusters: bool = True,
    within_bins: Optional[int] = None,
) -> CompactGrouping:
    """k-means grouping of V's tokens into a CompactGrouping (centroids kept for the next step).

    warm_start: a previous grouping of the same layer (same B, H, clusters, D); its centroids replace
    the seeded init, so fewer iterations reach the same quality on slowly changing V.
    order_clusters: renumber the clusters along a nearest-neighbour chain of their centroids
    (grouping_order.chain_ranks) so that 128-row blocks straddling two clusters mix similar ones;
    False keeps kmeans' ids (the reference's permutation exactly).
    within_bins: 0 keeps token order inside a cluster; 2..grouping_within.MAX_BINS puts each cluster's
    tokens in that many bins along its chain direction (kernels/grouping_within.py; needs order_clusters);
    None: DEFAULT_WITHIN_BINS with the chain order, 0 without it.
    """
    if within_bins is None:
        within_bins = DEFAULT_WITHIN_BINS if order_clusters else 0
    grouping_within.check_bins(within_bins)
    if within_bins >= 2 and not order_clusters:
        raise ValueError("within_bins orders tokens along the cluster chain: it needs order_clusters=True.")
    grouping = _group_tokens(v_bhnd, clusters, iters, seed, warm_start, order_clusters)
    if within_bins >= 2:
        grouping.within_bins = within_bins
        grouping.fresh_perm = _refined(v_bhnd, grouping, grouping.fresh_perm)
    return grouping


def _refined(v_bhnd: torch.Tensor, grouping: CompactGrouping, label_perm: Optional[torch.Tensor]) -> torch.Tensor:
    """A fresh grouping's permutation with its within-cluster bins (the fused kernel on its own label
    perm where the grouping ran fused, else the spec or within_cluster_perm's path)."""
    if label_perm is not None:  # the fused grouping ran: its perm is the stable label sort the kernel refines
        return grouping_fused.refine_perm(v_bhnd, label_perm, grouping.counts, grouping.centroids, grouping.within_bins)
    return within_cluster_perm(v_bhnd, grouping.labels, grouping.counts, grouping.centroids, grouping.within_bins)


def _group_tokens(v_bhnd, clusters, iters, seed, warm_start, order_clusters) -> CompactGrouping:
    init = None
    if warm_start is not None:
        if not warm_start.has_centroids:
            raise ValueError(
                "warm_start has no centroids (drop_centroids() was called): pass warm_start=None "
                "for a cold start."
            )
        init = warm_start.warm_centroids()
    _check_args(v_bhnd, clusters, iters)
    fused = _fused(v_bhnd, clusters, iters, seed, init, order=order_clusters)
    if fused is not None:
        return CompactGrouping(labels=fused["labels"], counts=fused["counts"], centroids=fused["centroids_fp16"],
                               fresh_perm=fused["perm"])
    labels, centroids = _torch_kmeans(v_bhnd, clusters, iters, seed, init)
    b, h, c, d = centroids.shape
    counts = _cluster_counts(labels, c)
    if order_clusters:
        rank = chain_ranks(centroids.view(b * h, c, d), counts.view(b * h, c)).view(b, h, c)
        labels = torch.gather(rank, -1, labels)
        counts = torch.empty_like(counts).scatter_(-1, rank, counts)
        centroids = torch.empty_like(centroids).scatter_(2, rank.unsqueeze(-1).expand(b, h, c, d), centroids)
    # labels count the capped cluster number; their dtype follows the requested one
    return CompactGrouping(
        labels=labels.to(label_dtype(clusters)),
        counts=counts,
        centroids=centroids.clamp(-FP16_MAX, FP16_MAX).to(torch.float16),
    )
