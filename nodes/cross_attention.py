"""Cross-attention calls (text tokens as keys): never quantized, but run on the fastest exact kernel.

The node leaves cross-attention to exact 16-bit attention: its keys are a few hundred text tokens, so
it is a small share of the time and V-Smooth's grouping has nothing to group. Which exact kernel runs
it still matters: ComfyUI's attention_pytorch asks torch SDPA for FlashAttention first
(comfy/ops.py SDPA_BACKEND_PRIORITY), and with 512 keys against 32,760 queries cuDNN's attention is
faster on the H200 (0.40 vs 0.66 ms at Wan2.1-1.3B with CFG, 3.1 vs 5.0 ms at Wan2.2-14B 720p:
bench/results/nvidia-h200-cross-attention-cost.json). Both are exact attention (float32
accumulation of 16-bit inputs); only the summation order differs.

So, inside the node's active range, a cross-attention call runs torch SDPA restricted to cuDNN where
torch says cuDNN can run it (`cudnn_reason`), timed per shape against the model's own attention with
the same sampled, non-blocking events as the self-attention calls (stats.RunStats, a separate
instance): where cuDNN measured slower (another GPU, another torch) the model's attention runs there
for the rest of the run. Counted per route in the node's stats ("cross_attention").
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F

from ..kernels.layout import to_bhnd
from . import override as O

# ComfyUI passes these through its attention functions (its attention wrapper adds the marker
# _inside_attn_wrapper; low_precision_attention=False asks for exact attention, which this is); none of
# them changes what SDPA computes
HARMLESS_KWARGS = frozenset({"transformer_options", "attn_precision", "_inside_attn_wrapper", "low_precision_attention"})


@functools.lru_cache(maxsize=None)
def _cudnn_backend():
    """torch's SDPA backend enum for cuDNN attention and the context that restricts SDPA to it, or None."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    backend = getattr(SDPBackend, "CUDNN_ATTENTION", None)
    return None if backend is None else (backend, sdpa_kernel)


def cudnn_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, kwargs: dict) -> Optional[str]:
    """Why this cross-attention call cannot run on cuDNN's attention (one phrase), or None when it can.
    q, k, v are (B, H, N, D) views."""
    if not q.is_cuda:
        return f"q is on {q.device.type}"
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype} (cuDNN's attention here takes float16 or bfloat16)"
    if mask is not None:
        return "an attention mask"
    extra = set(kwargs) - HARMLESS_KWARGS
    if extra:
        return f"arguments {sorted(extra)}"
    if _cudnn_backend() is None:
        return "this torch has no cuDNN SDPA backend"
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, False, False)
    if not torch.backends.cuda.can_use_cudnn_attention(params, False):
        return "torch's cuDNN attention does not take these tensors"
    return None


def bhnd_views(call: O.AttentionCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of the call as (B, H, N, D) views (no copies)."""
    views = []
    for t in (call.q, call.k, call.v):
        x, layout = O.to_kernel_layout(t, call.heads, call.skip_reshape)
        views.append(to_bhnd(x, layout))
    return views[0], views[1], views[2]


def cudnn_attention(call: O.AttentionCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The call through torch SDPA restricted to cuDNN (q, k, v: its bhnd_views), in the layout ComfyUI
    expects back."""
    backend, sdpa_kernel = _cudnn_backend()
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q, k, v)
    return O.to_output_layout(out, "bhnd", call.skip_output_reshape)
