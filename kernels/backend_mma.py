"""The `mma` backend: the portable mma.sync attention kernel over prepared operands (sm_89 and newer).

The extension is JIT-built on first use (kernels/jit.py); selecting the backend never builds it,
so `vc-attention doctor` and the registry stay cheap.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from . import jit, mma_pv_f16
from .backends import Backend, Constraints, register
from .config import KERNEL_P_ENCODINGS, VCConfig
from .layout import to_bhnd
from .operands import PreparedOperands

EXTENSION_NAME = "vc_attention_mma"
SOURCES = ("attn_mma_binding.cpp", "attn_mma.cu", "attn_mma_d64.cu", "attn_mma_d128.cu")
CONSTRAINTS = Constraints(
    min_capability=jit.MIN_CAPABILITY,  # FP8 mma.sync: Ada, Hopper, Blackwell
    dtypes=(torch.float16, torch.bfloat16),
    head_dims=(64, 128),
    p_encodings=KERNEL_P_ENCODINGS,
    aligned_rows=True,
    needs_jit=True,
)


@functools.cache
def extension(variant_flags: tuple[str, ...] = ()):
    """The compiled module (built once per process, cached on disk across processes).

    variant_flags: extra -D flags of a build-time kernel variant (bench/gpu_check.py times them,
    e.g. ("-DVC_MMA_STEP_KEYS=64",)); the default build is what the backend runs.
    """
    name = EXTENSION_NAME + ("_" + "_".join(f.lstrip("-D").replace("=", "").lower() for f in variant_flags) if variant_flags else "")
    return jit.load_extension(name, SOURCES, extra_cuda_cflags=variant_flags)


def attention_from_operands(ops: PreparedOperands, config: VCConfig, out: torch.Tensor, layout: str,
                            lse: Optional[torch.Tensor] = None, variant_flags: tuple[str, ...] = ()) -> torch.Tensor:
    """Run the attention kernel on prepared operands into `out` (q's shape in `layout`).

    lse (B,H,N) float32, if given, receives each row's natural-log log-sum-exp of the scores the
    kernel sees: with config.smooth_k those are shifted by q.mean(K)*sm_scale per row (softmax-
    invariant, but the LSE moves by that amount).
    The fp16-partial variant runs on V codes shifted by 2^-8 (kernels/mma_pv_f16.py): shifted here,
    so its time includes that pass.
    """
    if mma_pv_f16.uses_shifted_v(variant_flags):
        ops = mma_pv_f16.shifted_v_operands(ops)
    extension(variant_flags).attention(
        ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean,
        to_bhnd(out, layout), lse, ops.n_tokens, config.qk == "fp8", config.p == "expcast",
        config.v == "vsmooth", torch.cuda.current_stream(out.device).cuda_stream,
    )
    return out


register(Backend(name="mma", priority=50, constraints=CONSTRAINTS, attend=attention_from_operands))
