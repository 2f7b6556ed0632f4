"""The public op: `vc_attention(q, k, v, ...)`, a torch custom op dispatching to a backend.

Registered with torch.library.custom_op plus a fake (meta) implementation, so torch.compile can
trace through a model that calls it without graph breaks inside the kernel.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Optional, Union

import torch

from . import backends
from .config import FIDELITY, VCConfig
from .layout import check_layout, to_bhnd

# Which backend ran how many calls in this process (tests use it to prove a fast path ran).
BACKEND_CALLS: Counter = Counter()


# One op per loaded copy of the package: ComfyUI imports the pack by folder name while a pip install
# provides `vc_attention`; one shared op name would let the last copy silently serve both.
OP_NAME = "vc_attention::attention_" + re.sub(r"\W", "_", __package__)


@torch.library.custom_op(OP_NAME, mutates_args=())
def _attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    perm: Optional[torch.Tensor],
    layout: str,
    qk: str,
    v_format: str,
    p: str,
    smooth_k: bool,
    sm_scale: Optional[float],
    backend: str,
    selected: bool,
) -> torch.Tensor:
    config = VCConfig(qk=qk, v=v_format, p=p, smooth_k=smooth_k)
    # the one selection of this call: here, or by the caller that passed the Backend it selected
    chosen = backends.get(backend) if selected else backends.select(q, config, layout, backend, kv=(k, v))
    BACKEND_CALLS[chosen.name] += 1
    return chosen.run(q, k, v, perm, config, layout, sm_scale)


@_attention_op.register_fake
def _attention_fake(q, k, v, perm, layout, qk, v_format, p, smooth_k, sm_scale, backend, selected):
    return torch.empty_like(q)


def vc_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    layout: str = "bhnd",
    config: VCConfig = FIDELITY,
    perm: Optional[torch.Tensor] = None,
    sm_scale: Optional[float] = None,
    backend: Union[str, backends.Backend] = "auto",
) -> torch.Tensor:
    """Non-causal self-attention with VC-Attention quantization.

    q, k, v: fp16/bf16 (fp32 on the reference backend), one shape, layout "bhnd" = (B,H,N,D) or
    "bnhd" = (B,N,H,D); any strides with a contiguous last dim. perm: (B,H,N) integer permutation of
    the key/value tokens (V-Smooth grouping, from kernels.grouping); None keeps the original order.
    sm_scale: defaults to 1/sqrt(D). backend: "auto", a registered name (see `vc-attention doctor`), or
    the Backend that `backends.select` returned for this very call (a caller that must know the
    backend before it runs, like the node: the call is then not checked a second time).
    Returns a new tensor of q's shape, dtype and layout.
    """
    check_layout(layout)
    if q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            "vc_attention is self-attention: q, k and v must have the same shape, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}."
        )
    if perm is not None:
        b, h, n = to_bhnd(q, layout).shape[:3]
        if tuple(perm.shape) != (b, h, n):
            raise ValueError(f"perm must have shape (B, H, N) = {(b, h, n)}, got {tuple(perm.shape)}.")
    selected = isinstance(backend, backends.Backend)
    name = backend.name if selected else backend
    return _attention_op(q, k, v, perm, layout, config.qk, config.v, config.p, config.smooth_k, sm_scale, name, selected)
