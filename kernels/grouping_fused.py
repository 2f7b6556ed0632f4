"""The fused CUDA path of kernels/grouping.py: one JIT extension (csrc/grouping.cu) runs a whole
grouping (k-means rounds, cluster order, stable permutation) with every (batch, head) in one launch
per pass.

What it needs (`unsupported_reason` says which one is missing): V on a CUDA GPU in fp16/bf16, head
dim 64 or 128, 16-byte aligned rows, B*H <= 65535, at most 256 clusters (uint8 labels) and shared
memory for the centroids (float32: (C*(D+4) + C*D)*4 bytes + a token tile; 84 KB at 64 clusters,
D 128).
Anything else, and every CPU call, runs the torch implementation in grouping.py; the calls on each
path are counted in PATH_CALLS, and a CUDA call that falls back is logged once per reason.

Semantics (tested against reference.py in tests/test_grouping_fused_gpu.py): float32 distances
||c||^2 - 2 x.c from the exact 16-bit tokens and float32 centroids, ties to the lowest id, empty
clusters keep their centroid; so labels equal the float32 reference's except where two distances
are equal up to float rounding. Sums are added in a fixed order (no float atomics): the same input
gives bit-identical results on every run and in a CUDA-graph replay.

For bf16 V the assignment passes compute x.c on tensor cores (bf16 MMA, float32 accumulate) with
each float32 centroid split into three bf16 terms, which together carry float32's 24 significant
bits: the products are exact and only the accumulation order differs from the FP32 pass, so the
same near-tie tolerance holds. TENSOR_CORES = False selects the FP32 pass (the benchmark times both).
"""
from __future__ import annotations

import functools
import logging
from collections import Counter
from typing import Optional

import torch

from . import jit

EXTENSION_NAME = "vc_attention_grouping"
SOURCES = ("grouping_binding.cpp", "grouping.cu")
HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)
MAX_CLUSTERS = 256  # labels are uint8
MAX_GROUPS = 65535  # B*H: the grid's y dimension
TILE_TOKENS = 64  # csrc/grouping_params.h kGroupTileTokens
CHUNK = 64  # csrc/grouping_params.h kGroupChunk
BLOCKS_PER_SLOT = 2  # assignment blocks per resident block slot: a short tail, small partial buffers
SPLITS = 3  # csrc/grouping_params.h kGroupSplits: bf16 terms per float32 centroid
TENSOR_CORES = True  # bf16 V: the tensor-core assignment pass where its shared memory fits
# Build-time variants of csrc/grouping.cuh (compile flags): the GPU tests check each against the default
# build and bench/prepare_profile.py --grouping-build times it. BUILD below is the one run() uses.
VARIANTS: dict[str, tuple[str, ...]] = {
    "default": (),
    "order-block": ("-DVC_GROUP_ORDER_WARP=0",),  # the block-wide chain for every cluster count
    "order-direct": ("-DVC_GROUP_ORDER_GRAM=0",),  # the one-warp chain without the Gram matrix (default until session 14)
}
BUILD = "default"

PATH_CALLS: Counter = Counter()  # "fused", or "torch: <reason>"
_disabled: Optional[str] = None  # set when the extension failed to build in this process
_logged: set[str] = set()


def pass_smem_bytes(head_dim: int, clusters: int, tensor_cores: bool = False) -> int:
    """Shared memory of the assignment pass (csrc/grouping_params.h group_pass_smem_bytes)."""
    cp = -(-clusters // CHUNK) * CHUNK
    if tensor_cores:
        tiles = SPLITS * cp * head_dim * 2 + TILE_TOKENS * head_dim * 2
    else:
        tiles = cp * (head_dim + 4) * 4 + TILE_TOKENS * (head_dim + 4) * 2
    return tiles + cp * head_dim * 4 + cp * 8 + TILE_TOKENS * 4


def uses_tensor_cores(dtype: torch.dtype, head_dim: int, clusters: int, optin: int) -> bool:
    """Whether the assignment passes run on tensor cores: bf16 V (exact as an MMA operand), the
    switch on, and the bf16 centroid terms fit in shared memory (else the FP32 pass runs)."""
    return TENSOR_CORES and dtype == torch.bfloat16 and pass_smem_bytes(head_dim, clusters, True) <= optin


def order_smem_bytes(head_dim: int, clusters: int, build: Optional[str] = None) -> int:
    """Shared memory of the cluster-order kernel (csrc/grouping_params.h group_order_smem_bytes) in a build
    of VARIANTS (default: BUILD): the one-warp chain's 64 x 64 Gram matrix up to 64 clusters, except in
    the build without it."""
    gram = "-DVC_GROUP_ORDER_GRAM=0" not in VARIANTS[BUILD if build is None else build]
    return clusters * (head_dim + 1) * 4 + clusters * 16 + head_dim * 4 + 64 * 4 + (64 * 64 * 4 if gram and clusters <= 64 else 0)


@functools.lru_cache(maxsize=None)
def _device_limits(index: int) -> tuple[int, int, int]:
    """(SMs, shared memory per block with opt-in, shared memory per SM) of a CUDA device."""
    props = torch.cuda.get_device_properties(index)
    optin = getattr(props, "shared_memory_per_block_optin", 99 * 1024)
    per_sm = getattr(props, "shared_memory_per_multiprocessor", optin + 1024)
    return props.multi_processor_count, optin, per_sm


@functools.lru_cache(maxsize=None)
def _runtime_reason() -> Optional[str]:
    return jit.runtime_reason() or jit.toolchain_reason()


def _machine_reason(t: torch.Tensor, name: str) -> Optional[str]:
    """Why no fused kernel can run on `t` whatever its shape (not on CUDA, no build, no toolchain), or None."""
    if not t.is_cuda:
        return f"{name} {'is' if name == 'V' else 'are'} on {t.device.type}"
    return _disabled if _disabled is not None else _runtime_reason()


def unsupported_reason(v: torch.Tensor, clusters: int) -> Optional[str]:
    """Why the fused path cannot group this V (one short phrase), or None when it can."""
    reason = _machine_reason(v, "V")
    if reason:
        return reason
    if v.dtype not in DTYPES:
        return f"dtype {v.dtype} (the kernels read float16 or bfloat16)"
    d = v.shape[-1]
    if d not in HEAD_DIMS:
        return f"head dim {d} (supported: {HEAD_DIMS})"
    if v.shape[0] * v.shape[1] > MAX_GROUPS:
        return f"{v.shape[0] * v.shape[1]} (batch, head) pairs (at most {MAX_GROUPS}: one grid row each)"
    if clusters > MAX_CLUSTERS:
        return f"{clusters} clusters (at most {MAX_CLUSTERS}: labels are uint8)"
    if v.stride(-1) != 1 or v.data_ptr() % 16 or any(s % 8 for s in v.stride()[:3]):
        return "V's rows are not contiguous and 16-byte aligned"
    c = min(clusters, v.shape[2])
    _, optin, _ = _device_limits(v.device.index if v.device.index is not None else torch.cuda.current_device())
    if max(pass_smem_bytes(d, c), order_smem_bytes(d, c)) > optin:
        return f"{clusters} clusters at head dim {d} need more shared memory than this GPU has"
    return None


def count_fallback(v: torch.Tensor, reason: str) -> None:
    """Count a grouping on the torch path; on CUDA, log the reason once per process."""
    PATH_CALLS[f"torch: {reason}"] += 1
    if v.is_cuda and reason not in _logged:
        _logged.add(reason)
        logging.info(f"VC-Attention: grouping runs the torch implementation (slower): {reason}")


def disable(reason: str) -> None:
    """Use the torch path for the rest of the process (the extension could not be built)."""
    global _disabled
    _disabled = f"the fused grouping kernels could not be built ({reason.splitlines()[0]})"
    logging.warning(f"VC-Attention: {_disabled}; grouping uses the torch implementation.")


def extension():
    """The compiled module of the BUILD variant (built once per process, cached on disk)."""
    return _extension(BUILD)


@functools.cache
def _extension(variant: str):
    if variant not in VARIANTS:
        raise ValueError(f"unknown grouping build {variant!r}; known: {sorted(VARIANTS)}")
    if variant == "default":
        return jit.load_extension(EXTENSION_NAME, SOURCES)
    return jit.load_extension(f"{EXTENSION_NAME}_{variant.replace('-', '_')}", SOURCES,
                              extra_cuda_cflags=VARIANTS[variant])


def parts_for(device: torch.device, groups: int, n: int, head_dim: int, clusters: int, tensor_cores: bool = False) -> int:
    """Blocks per (batch, head) of the assignment pass: a few per resident block slot of the GPU
    in all (depends on the shape, the pass and the GPU only, never on the data)."""
    sms, _, per_sm = _device_limits(device.index if device.index is not None else torch.cuda.current_device())
    resident = max(1, min(16, per_sm // (pass_smem_bytes(head_dim, clusters, tensor_cores) + 1024)))
    target = BLOCKS_PER_SLOT * sms * resident
    tiles = -(-n // TILE_TOKENS)
    return max(1, min(tiles, -(-target // groups)))


def run(v: torch.Tensor, centroids: torch.Tensor, iters: int, order: Optional[bool]) -> dict:
    """One grouping on the GPU. v (B,H,N,D) 16-bit; centroids (B,H,C,D) float32, a private copy
    (updated in place). order None: k-means only; True/False: also the chain order (False: k-means
    ids) and the permutation. Returns the tensors as a dict (see grouping.py for their use)."""
    b, h, n, d = v.shape
    c = centroids.shape[2]
    g = b * h
    device = v.device
    _, optin, _ = _device_limits(device.index if device.index is not None else torch.cuda.current_device())
    tensor_cores = uses_tensor_cores(v.dtype, d, c, optin)
    parts = parts_for(device, g, n, d, c, tensor_cores)
    out = {
        "centroids": centroids,
        "raw_labels": torch.empty(b, h, n, dtype=torch.uint8, device=device),
    }
    part_sums = torch.empty(g, parts, c, d, dtype=torch.float32, device=device)
    part_counts = torch.empty(g, parts, c, dtype=torch.int32, device=device)
    if order is not None:
        out.update(
            rank=torch.empty(b, h, c, dtype=torch.int32, device=device),
            counts=torch.empty(b, h, c, dtype=torch.int32, device=device),
            centroids_fp16=torch.empty(b, h, c, d, dtype=torch.float16, device=device),
            labels=torch.empty(b, h, n, dtype=torch.uint8, device=device),
            perm=torch.empty(b, h, n, dtype=torch.int32, device=device),
        )
    extension().kmeans_group(
        v, centroids.view(g, c, d), part_sums, part_counts, out["raw_labels"], out.get("rank"), out.get("counts"),
        out.get("centroids_fp16"), out.get("labels"), out.get("perm"), iters, bool(order), tensor_cores, optin,
        torch.cuda.current_stream(device).cuda_stream,
    )
    PATH_CALLS["fused"] += 1
    if tensor_cores:
        PATH_CALLS["fused: tensor cores"] += 1
    return out


def labels_unsupported_reason(labels: torch.Tensor, clusters: int) -> Optional[str]:
    """Why the fused permutation cannot sort these stored labels (one short phrase), or None."""
    reason = _machine_reason(labels, "labels")
    if reason:
        return reason
    if labels.dim() != 3 or labels.dtype != torch.uint8:  # one phrase per kind, not per shape (logged once)
        return f"{labels.dim()}-D {labels.dtype} labels (the kernel sorts (B, H, N) uint8 labels)"
    if clusters > MAX_CLUSTERS:
        return f"{clusters} clusters (at most {MAX_CLUSTERS}: labels are uint8)"
    if labels.shape[0] * labels.shape[1] > MAX_GROUPS:
        return f"{labels.shape[0] * labels.shape[1]} (batch, head) pairs (at most {MAX_GROUPS}: one grid row each)"
    return None


def label_parts(device: torch.device, groups: int, n: int) -> int:
    """Blocks per (batch, head) of the label-count and permutation kernels: ~4 blocks of 256 threads
    per SM in all (a function of the shape and the GPU only)."""
    sms, _, _ = _device_limits(device.index if device.index is not None else torch.cuda.current_device())
    tiles = -(-n // TILE_TOKENS)
    return max(1, min(tiles, -(-4 * sms // groups)))


def permute_labels(labels: torch.Tensor, clusters: int) -> torch.Tensor:
    """(B,H,N) int32 stable permutation of a cached grouping's labels (ids < clusters, as the
    grouping wrote them) in two launches and no sort: per-part counts, then the permutation kernel's
    scatter. The same result as torch.sort(labels, stable=True).indices."""
    b, h, n = labels.shape
    labels = labels.contiguous()
    parts = label_parts(labels.device, b * h, n)
    part_counts = torch.empty(b * h, parts, clusters, dtype=torch.int32, device=labels.device)
    perm = torch.empty(b, h, n, dtype=torch.int32, device=labels.device)
    extension().permute_labels(labels, part_counts, perm, torch.cuda.current_stream(labels.device).cuda_stream)
    PATH_CALLS["fused: reuse permutation"] += 1
    return perm


def refine_perm(v: torch.Tensor, perm: torch.Tensor, counts: torch.Tensor, centroids: torch.Tensor,
                bins: int) -> torch.Tensor:
    """(B,H,N) int32: each cluster's tokens of the label-sorted `perm` in `bins` bins along its chain
    direction (kernels/grouping_within.py is the spec; one launch, csrc/grouping_refine.cuh). counts (B,H,C)
    int32 and centroids (B,H,C,D) in perm's label ids; perm must be the stable sort by those labels."""
    b, h, n, d = v.shape
    g, c = b * h, counts.shape[-1]
    keys = torch.empty(g, n, dtype=torch.float32, device=v.device)
    out = torch.empty(b, h, n, dtype=torch.int32, device=v.device)
    extension().refine_perm(v, perm.contiguous(), counts.contiguous(), centroids.to(torch.float16).contiguous(), keys,
                            out, bins, torch.cuda.current_stream(v.device).cuda_stream)
    PATH_CALLS["fused: within-cluster order"] += 1
    return out
