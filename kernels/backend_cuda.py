"""The `mma` backend: fused CUDA prepare + the portable mma.sync attention kernel (sm_89 and newer).

The extension is JIT-built on first use (kernels/jit.py); selecting the backend never builds it,
so `vc-attention doctor` and the registry stay cheap.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from . import jit, reference
from .backends import Backend, register
from .config import KERNEL_P_ENCODINGS, VCConfig
from .prepare import PreparedOperands, prepare_and_run, rows_aligned

EXTENSION_NAME = "vc_attention_mma"
SOURCES = ("bindings.cpp", "prepare.cu", "attn_mma.cu", "attn_mma_d64.cu", "attn_mma_d128.cu")
HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)


@functools.cache
def extension(variant_flags: tuple[str, ...] = ()):
    """The compiled module (built once per process, cached on disk across processes).

    variant_flags: extra -D flags of a build-time kernel variant (bench/gpu_check.py times them,
    e.g. ("-DVC_MMA_STEP_KEYS=64",)); the default build is what the backend runs.
    """
    name = EXTENSION_NAME + ("_" + "_".join(f.lstrip("-D").replace("=", "").lower() for f in variant_flags) if variant_flags else "")
    return jit.load_extension(name, SOURCES, extra_cuda_cflags=variant_flags)


def _available_reason() -> Optional[str]:
    reason = jit.runtime_reason()
    if reason:
        return reason
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < jit.MIN_CAPABILITY:
        return f"GPU is sm_{major}{minor}; FP8 tensor cores need sm_89 or newer"
    return jit.toolchain_reason()


def _unsupported_reason(q: torch.Tensor, config: VCConfig, layout: str) -> Optional[str]:
    if not q.is_cuda:
        return f"inputs are on {q.device}, not a CUDA GPU"
    if q.dtype not in DTYPES:
        return f"dtype {q.dtype} (needs float16 or bfloat16)"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]} (supported: {HEAD_DIMS})"
    if torch.cuda.get_device_capability(q.device) < jit.MIN_CAPABILITY:
        return "GPU below sm_89"
    if config.p not in KERNEL_P_ENCODINGS:
        return f"P encoding {config.p!r} is emulation only (the kernels implement {KERNEL_P_ENCODINGS})"
    if not rows_aligned(q):
        return "q, k, v need a contiguous last dim and 16-byte aligned rows"
    return None


def attention_from_operands(ops: PreparedOperands, config: VCConfig, out: torch.Tensor, layout: str,
                            lse: Optional[torch.Tensor] = None, variant_flags: tuple[str, ...] = ()) -> torch.Tensor:
    """Run the attention kernel on prepared operands into `out` (q's shape in `layout`).

    lse (B,H,N) float32, if given, receives each row's natural-log log-sum-exp of the scores the
    kernel sees: with config.smooth_k those are shifted by q.mean(K)*sm_scale per row (softmax-
    invariant, but the LSE moves by that amount).
    """
    extension(variant_flags).attention(
        ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean,
        reference.to_bhnd(out, layout), lse, ops.n_tokens, config.qk == "fp8", config.p == "expcast",
        config.v == "vsmooth", torch.cuda.current_stream(out.device).cuda_stream,
    )
    return out


def _run(q, k, v, perm, config: VCConfig, layout: str, sm_scale):
    return prepare_and_run(q, k, v, perm, config, layout, sm_scale, attention_from_operands, "mma")


register(Backend(name="mma", priority=50, run=_run, unsupported_reason=_unsupported_reason,
                 available_reason=_available_reason))
