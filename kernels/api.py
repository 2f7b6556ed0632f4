"""The public op: `vc_attention(q, k, v, ...)`, a torch custom op dispatching to a backend.

Registered with torch.library.custom_op plus a fake (meta) implementation, so torch.compile can
trace through a model that calls it without graph breaks inside the kernel.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Optional

import torch

from . import backends, inputs
from .config import FIDELITY, VCConfig

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
    perm_from_grouping: bool,
) -> torch.Tensor:
    inputs.check_perm_values(perm, perm_from_grouping)
    config = VCConfig(qk=qk, v=v_format, p=p, smooth_k=smooth_k)
    chosen = backends.select(q, config, layout, backend)
    BACKEND_CALLS[chosen.name] += 1
    return chosen.run(q, k, v, perm, config, layout, sm_scale)


@_attention_op.register_fake
def _attention_fake(q, k, v, perm, layout, qk, v_format, p, smooth_k, sm_scale, backend, perm_from_grouping):
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
    backend: str = "auto",
    perm_from_grouping: bool = False,
) -> torch.Tensor:
    """Non-causal self-attention with VC-Attention quantization (inference only: no backward).

    q, k, v: fp16/bf16 (fp32 on the reference backend), one shape, layout "bhnd" = (B,H,N,D) or
    "bnhd" = (B,N,H,D); any strides with a contiguous last dim. perm: (B,H,N) int32/int64 permutation
    of the key/value tokens (V-Smooth grouping, from kernels.grouping); None keeps the original order.
    Its range is always checked; that it is a permutation too (one bincount), unless
    perm_from_grouping=True promises it is kernels.grouping's perm() (a permutation by construction:
    the node's path). sm_scale: defaults to 1/sqrt(D). backend: "auto" or a registered name (see
    `vc-attention doctor`). Returns a new tensor of q's shape, dtype and layout (empty if q is); fp16
    saturates at +-65504. A NaN or Inf in q reaches its 64-row scale block (SDPA: its row), in k the
    whole head, in v that channel of the head (as in SDPA).
    """
    inputs.check_call(q, k, v, layout, config)
    b, h, n = (q.shape[0], q.shape[1], q.shape[2]) if layout == "bhnd" else (q.shape[0], q.shape[2], q.shape[1])
    inputs.check_perm_shape(perm, b, h, n)
    if q.numel() == 0:
        return torch.empty_like(q)
    return _attention_op(q, k, v, perm, layout, config.qk, config.v, config.p, config.smooth_k, sm_scale, backend,
                         perm_from_grouping)
