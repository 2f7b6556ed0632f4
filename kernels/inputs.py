"""What the public op checks before any backend sees a call: one readable sentence per mistake.

Every backend may then assume four same-shape, same-dtype float tensors, a VCConfig, no autograd
and, when a perm is given, a (B,H,N) integer permutation of 0..N-1 per (batch, head). The CUDA
prepare kernel reads K and V rows through perm without a bounds check, so this is also what keeps
a bad perm from reading outside the tensors.
"""
from __future__ import annotations

from typing import Optional

import torch

from .config import VCConfig
from .layout import check_layout

# fp16/bf16 are what the CUDA kernels take; float32 runs on the reference emulation only.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
PERM_DTYPES = (torch.int32, torch.int64)


def check_call(q, k, v, layout: str, config) -> None:
    """Types, layout, rank, one shape, one float dtype, the config, and no autograd."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError(f"q, k and v must be tensors, got {type(q).__name__}, {type(k).__name__}, {type(v).__name__}.")
    check_layout(layout)
    if not q.dim() == k.dim() == v.dim() == 4:
        raise ValueError(f"q, k and v must be 4-D tensors in layout {layout!r}, got {q.dim()}-D, {k.dim()}-D, {v.dim()}-D.")
    if q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            "vc_attention is self-attention: q, k and v must have the same shape, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}."
        )
    if q.dtype not in FLOAT_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(
            "q, k and v must have one dtype, float16 or bfloat16 (float32 on the reference backend), got "
            f"{q.dtype}, {k.dtype}, {v.dtype}."
        )
    if not isinstance(config, VCConfig):
        raise TypeError(f"config must be a VCConfig (e.g. kernels.FIDELITY), got {config!r}.")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise ValueError(
            "vc_attention has no backward pass: call it under torch.no_grad() or torch.inference_mode(), "
            "or on tensors that do not require grad."
        )


def check_perm_shape(perm: Optional[torch.Tensor], b: int, h: int, n: int) -> None:
    """perm must be None or a (B,H,N) int32/int64 tensor (static facts: checked while tracing too)."""
    if perm is None:
        return
    if not isinstance(perm, torch.Tensor) or perm.dtype not in PERM_DTYPES:
        raise TypeError(f"perm must be an int32 or int64 tensor, got {getattr(perm, 'dtype', type(perm).__name__)}.")
    if tuple(perm.shape) != (b, h, n):
        raise ValueError(f"perm must have shape (B, H, N) = {(b, h, n)}, got {tuple(perm.shape)}.")


def check_basis(basis: Optional[torch.Tensor], config, b: int, h: int, d: int, device: torch.device) -> None:
    """The low-rank term's basis: None, or (B,H,config.v_rank,D) float16 on q's device (config.v_rank > 0)."""
    if basis is None:
        return
    if not config.v_rank:
        raise ValueError("v_basis was given, but the configuration has v_rank=0 (no low-rank V term).")
    want = (b, h, config.v_rank, d)
    if not isinstance(basis, torch.Tensor) or basis.dtype != torch.float16 or tuple(basis.shape) != want or basis.device != device:
        raise ValueError(f"v_basis must be a float16 tensor of shape (B, H, v_rank, D) = {want} on {device}, got "
                         f"{getattr(basis, 'dtype', type(basis).__name__)} {tuple(getattr(basis, 'shape', ()))}.")


def check_perm_values(perm: Optional[torch.Tensor], from_grouping: bool) -> None:
    """Every value of the (B,H,N) perm in [0, N) and a permutation in every (batch, head): one
    bincount over all (batch, head) rows, offset so rows never share a bin, finds a repeated or
    missing token. The verdict costs one host sync, so this runs inside the custom op (on real
    tensors, also under torch.compile), not while a graph is traced.

    from_grouping=True is the trusted path (the node, the benchmarks): kernels.grouping's perm() is
    a stable sort of cluster labels, a permutation of 0..N-1 by construction, so nothing is checked
    and no attention call waits for the GPU; the CUDA prepare kernel still never reads outside the
    head (csrc/prepare.cuh: an out-of-range index reads its own slot's token).
    """
    if perm is None or perm.numel() == 0 or from_grouping:
        return
    b, h, n = perm.shape
    lo, hi = torch.aminmax(perm)
    in_range = (lo >= 0) & (hi < n)
    rows = torch.arange(b * h, device=perm.device).view(b, h, 1) * n
    bins = (perm.long().clamp(0, n - 1) + rows).reshape(-1)
    ok = in_range & (torch.bincount(bins, minlength=b * h * n) == 1).all()
    if bool(ok):
        return
    if not bool(in_range):
        raise ValueError(f"perm values must lie in [0, {n}) (N = {n} tokens), got values from {int(lo)} to {int(hi)}.")
    raise ValueError(
        "perm must be a permutation of 0..N-1 in every (batch, head): a token is repeated or missing, "
        "which would silently give a wrong output."
    )
