"""The `sm90` backend: the Hopper fast path (sm_90a wgmma + TMA, warp-specialized).

Consumes the prepare step's operands (kernels/prepare.py, run by the `mma` extension's fused CUDA
kernels) and runs kernels/csrc/sm90_*.cu. JIT-built on first use for sm_90a only; selecting the
backend never builds anything.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from . import jit, reference
from .backends import Backend, register
from .config import KERNEL_P_ENCODINGS, VCConfig
from .prepare import PreparedOperands, prepare_and_run, rows_aligned

EXTENSION_NAME = "vc_attention_sm90"
SOURCES = ("sm90_binding.cpp", "sm90_launch.cu")
ARCH = "9.0a"  # wgmma and setmaxnreg exist only in the arch-specific Hopper target
HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)


@functools.cache
def extension():
    """The compiled module (built once per process, cached on disk across processes)."""
    return jit.load_extension(EXTENSION_NAME, SOURCES, arch=ARCH)


def _available_reason() -> Optional[str]:
    reason = jit.runtime_reason()
    if reason:
        return reason
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"GPU is sm_{major}{minor}; this kernel is for Hopper (sm_90) only"
    return jit.toolchain_reason(ARCH)


def _unsupported_reason(q: torch.Tensor, config: VCConfig, layout: str) -> Optional[str]:
    if not q.is_cuda:
        return f"inputs are on {q.device}, not a CUDA GPU"
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return "GPU is not sm_90 (Hopper)"
    if q.dtype not in DTYPES:
        return f"dtype {q.dtype} (needs float16 or bfloat16)"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]} (supported: {HEAD_DIMS})"
    if config.qk != "int8":
        return "FP8 QK is not implemented in the sm90 kernel (INT8 QK only)"
    if config.p not in KERNEL_P_ENCODINGS:
        return f"P encoding {config.p!r} is emulation only (the kernels implement {KERNEL_P_ENCODINGS})"
    if not rows_aligned(q):
        return "q, k, v need a contiguous last dim and 16-byte aligned rows"
    return None


def attention_from_operands(ops: PreparedOperands, config: VCConfig, out: torch.Tensor, layout: str) -> torch.Tensor:
    """Run the Hopper kernel on prepared operands into `out` (q's shape in `layout`)."""
    extension().attention(
        ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean, reference.to_bhnd(out, layout),
        ops.n_tokens, config.p == "expcast", config.v == "vsmooth", torch.cuda.current_stream(out.device).cuda_stream,
    )
    return out


def _run(q, k, v, perm, config: VCConfig, layout: str, sm_scale):
    return prepare_and_run(q, k, v, perm, config, layout, sm_scale, attention_from_operands, "sm90")


register(Backend(name="sm90", priority=60, run=_run, unsupported_reason=_unsupported_reason,
                 available_reason=_available_reason))
