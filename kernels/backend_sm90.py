"""The `sm90` backend: the Hopper fast path (sm_90a wgmma + TMA, warp-specialized).

Attention over the prepare step's operands (kernels/operands.py, built by the fused prepare
extension of kernels/prepare_cuda.py): kernels/csrc/sm90_*.cu. JIT-built on first use for sm_90a
only; selecting the backend never builds anything.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from . import jit
from .backends import Backend, Constraints, register
from .config import KERNEL_P_ENCODINGS, VCConfig
from .layout import to_bhnd
from .operands import PreparedOperands

EXTENSION_NAME = "vc_attention_sm90"
SOURCES = ("sm90_binding.cpp", "sm90_launch.cu")
ARCH = "9.0a"  # wgmma and setmaxnreg exist only in the arch-specific Hopper target
CONSTRAINTS = Constraints(
    min_capability=(9, 0),
    max_capability=(9, 0),
    dtypes=(torch.float16, torch.bfloat16),
    head_dims=(64, 128),
    qk_formats=("int8",),  # the wgmma QK path is INT8 only
    p_encodings=KERNEL_P_ENCODINGS,
    aligned_rows=True,
    jit_arch=ARCH,
    needs_jit=True,
)


@functools.cache
def extension():
    """The compiled module (built once per process, cached on disk across processes)."""
    return jit.load_extension(EXTENSION_NAME, SOURCES, arch=ARCH)


def attention_from_operands(ops: PreparedOperands, config: VCConfig, out: torch.Tensor, layout: str) -> torch.Tensor:
    """Run the Hopper kernel on prepared operands into `out` (q's shape in `layout`)."""
    extension().attention(
        ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean, to_bhnd(out, layout),
        ops.n_tokens, config.p == "expcast", config.v == "vsmooth", torch.cuda.current_stream(out.device).cuda_stream,
    )
    return out


register(Backend(name="sm90", priority=60, constraints=CONSTRAINTS, attend=attention_from_operands))
