"""The attention override ComfyUI calls, and what makes a call eligible for VC-Attention.

ComfyUI (>= 0.3.60) routes every `optimized_attention(...)` of a model whose
model_options["transformer_options"]["optimized_attention_override"] is set through
`override(func, q, k, v, heads=..., mask=..., attn_precision=..., skip_reshape=...,
skip_output_reshape=..., transformer_options=..., **kwargs)`, where `func` is the attention the
model would have used. Layouts: q/k/v are (B, N, H*D) unless skip_reshape, then (B, H, N, D); the
output must be (B, N, H*D) unless skip_output_reshape, then (B, H, N, D).
AttentionTensorContainer inputs (ComfyUI >= 0.31's single-owner tensors) need nothing here: this
override defines no `container_function`, so ComfyUI's wrap_attn takes the tensors out of their
containers before calling it, and `func` is then called with plain tensors as well.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..kernels.layout import to_bhnd

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)

# Fallback reasons (keys of the stats' "fallbacks"; the web extension shows them as they are).
MASK = "mask"
LOW_PRECISION_OFF = "low_precision_attention_off"
CROSS_ATTENTION = "cross_attention"
GQA = "gqa_or_mqa"
DTYPE = "dtype"
SHAPE = "shape"
OUTSIDE_RANGE = "outside_start_end"
NO_SIGMA = "no_sigma"
NO_GPU = "no_cuda_gpu"
NO_BACKEND = "no_capable_backend"
BUILD_FAILED = "kernel_build_failed"
AUTOGRAD = "autograd"
SLOWER = "slower than the model's attention at this shape"


def ineligible(q, k, v, heads: int, mask, skip_reshape: bool, kwargs: dict) -> Optional[tuple[str, str]]:
    """(reason, detail) if this call must stay on the model's attention whatever the machine, else None.

    Only the call's structure is checked here; device, GPU arch and head dim are the backends'
    business (kernels.backends.select says which one can run, or why none can), dtype and memory
    layout that of `unsupported_tensors`.
    """
    if mask is not None:
        return MASK, "attention masks are not supported (VC-Attention is unmasked, non-causal)"
    if kwargs.get("low_precision_attention", True) is False:
        return LOW_PRECISION_OFF, "the model asked for full-precision attention on this call"
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return SHAPE, "q, k and v are not tensors"
    rank = 4 if skip_reshape else 3
    if q.dim() != rank or k.dim() != rank or v.dim() != rank:
        return SHAPE, f"expected {rank}-D q/k/v, got {q.dim()}-D/{k.dim()}-D/{v.dim()}-D"
    if q.numel() == 0 or k.numel() == 0 or v.numel() == 0:
        return SHAPE, "an empty q/k/v (a batch, head or token count of 0)"
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return AUTOGRAD, "q/k/v require grad (training or gradient guidance); VC-Attention has no backward pass"
    if not skip_reshape and q.shape[-1] % heads:
        return SHAPE, f"q's last dim {q.shape[-1]} is not a multiple of heads={heads}"
    token_dim = 2 if skip_reshape else 1
    if k.shape[token_dim] != q.shape[token_dim] or v.shape[token_dim] != q.shape[token_dim]:
        return CROSS_ATTENTION, f"cross-attention ({q.shape[token_dim]} queries, {k.shape[token_dim]} keys)"
    if k.shape != q.shape or v.shape != q.shape:
        return GQA, f"grouped/multi-query attention (q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})"
    return None


def unsupported_tensors(q, k, v) -> Optional[tuple[str, str]]:
    """(reason, detail) if the chosen kernel cannot read these tensors, else None.

    Asked after a backend was chosen: on a machine where no kernel runs at all (no CUDA GPU) the
    backend's reason is the one worth showing, not the dtype the CPU happens to compute in.
    """
    if q.dtype not in SUPPORTED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return DTYPE, f"dtype {q.dtype}/{k.dtype}/{v.dtype} (the kernels take fp16 or bf16)"
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        return SHAPE, "the head dimension is not contiguous in memory (the kernels read rows of D values)"
    return None


def to_kernel_layout(t: torch.Tensor, heads: int, skip_reshape: bool) -> tuple[torch.Tensor, str]:
    """The tensor as the kernel API takes it, without copying: (B,H,N,D) "bhnd" or (B,N,H,D) "bnhd"."""
    if skip_reshape:
        return t, "bhnd"
    b, n, hd = t.shape
    return t.view(b, n, heads, hd // heads), "bnhd"


def to_output_layout(out: torch.Tensor, layout: str, skip_output_reshape: bool) -> torch.Tensor:
    """(B,H,N,D) if skip_output_reshape, else (B,N,H*D): what ComfyUI's attention functions return."""
    bhnd = to_bhnd(out, layout)
    if skip_output_reshape:
        return bhnd
    b, h, n, d = bhnd.shape
    return bhnd.transpose(1, 2).reshape(b, n, h * d)


@dataclass
class AttentionCall:
    """One attention call as ComfyUI made it, plus the two ways to run it without VC-Attention."""

    func: Callable
    previous: Optional[Callable]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    heads: int
    mask: Optional[torch.Tensor]
    skip_reshape: bool
    skip_output_reshape: bool
    kwargs: dict  # everything else ComfyUI passed (transformer_options, scale, attn_precision, ...)

    def _arguments(self) -> dict:
        return dict(mask=self.mask, skip_reshape=self.skip_reshape, skip_output_reshape=self.skip_output_reshape,
                    **self.kwargs)

    def model_attention(self) -> torch.Tensor:
        """What would run without us: the override that was on the hook before ours, else `func`."""
        if self.previous is None:
            return self.func(self.q, self.k, self.v, self.heads, **self._arguments())
        return self.previous(self.func, self.q, self.k, self.v, self.heads, **self._arguments())

    def model_attention_id(self) -> tuple:
        """Which attention `model_attention` runs (what its time depends on besides the tensors): the
        chained override and the model's function, by module and name."""
        def name(fn) -> Optional[str]:
            if fn is None:
                return None
            fn = getattr(fn, "func", fn)  # functools.partial
            return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
        return name(self.previous), name(self.func)

    def own_attention(self) -> torch.Tensor:
        """The model's attention function alone (the timing baseline: no other override's side effects)."""
        return self.func(self.q, self.k, self.v, self.heads, **self._arguments())


def make_override(handler: Callable[[AttentionCall], torch.Tensor], previous: Optional[Callable]) -> Callable:
    """An override for the transformer_options hook that hands every call to `handler`.

    handler(call) runs VC-Attention or returns call.model_attention(): the previous override on the
    hook (chained) or else the model's own `func`, with the call's arguments unchanged.
    """

    # torch.compile (e.g. ComfyUI's TorchCompileModel) must not trace this: the schedule reads the
    # sigma on the host and the cache is Python state. Dynamo runs it eagerly between graphs.
    @torch.compiler.disable
    def vc_attention_override(func, q, k, v, heads, mask=None, skip_reshape=False, skip_output_reshape=False, **kwargs):
        return handler(AttentionCall(func, previous, q, k, v, heads, mask, skip_reshape, skip_output_reshape, kwargs))

    vc_attention_override.handler = handler  # lets tests and tools find the patch behind a hook
    return vc_attention_override
