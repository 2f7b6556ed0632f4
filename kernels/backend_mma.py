"""The `mma` backend: the portable mma.sync attention kernel over prepared operands (sm_89 and newer).

The extension is JIT-built on first use (kernels/jit.py); selecting the backend never builds it,
so `vc-attention doctor` and the registry stay cheap.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from typing import Optional

import torch

from . import jit, mma_pv_f16, mma_v_f16, mma_variants
from .backends import Backend, Constraints, register
from .config import KERNEL_P_ENCODINGS, VCConfig
from .constants import K_BLOCK
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
    # K scales per lane (VCConfig.k_lane_scales): the wide layout's INT8 V-Smooth head-dim-128 kernels (every default
    # build is wide; a 16-row variant build's binding refuses them with a sentence)
    k_lane_scales=True,
    needs_jit=True,
)


# keys per online-softmax step of the default (wide) build (kChunkKeys in attn_mma_wide.cuh): its exact
# emulation is reference.vc_attention_reference(..., offset_block=SOFTMAX_STEP_KEYS)
SOFTMAX_STEP_KEYS = 64


def default_flags() -> tuple[str, ...]:
    """The -D flags of the build the backend runs for the target arch (mma_variants.default_variant):
    VC_ATTENTION_ARCH if set, else the current GPU's (jit.target_arch), with the PV accumulation of
    pv_accum()."""
    arch = jit.target_arch()
    return mma_variants.flags(mma_variants.default_variant(arch, pv_accum(arch)))


def pv_accum(arch: Optional[str] = None) -> str:
    """"fp32" or "fp32+fp16": VC_ATTENTION_MMA_PV_ACCUM if set, else by the GPU (mma_variants.default_pv_accum:
    fp32+fp16 on GeForce Ada / consumer Blackwell, whose fp32-accumulator FP8 rate is half)."""
    arch = arch or jit.target_arch()
    override = os.environ.get(mma_variants.PV_ACCUM_ENV, "").strip() or None
    name = None
    if not os.environ.get(jit.ENV_PREFIX + "ARCH", "").strip() and torch.cuda.is_available():
        name = _device_name(torch.cuda.current_device())
    return mma_variants.default_pv_accum(arch, name, override)


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def extension(variant_flags: Optional[tuple[str, ...]] = None):
    """The compiled module (built once per process, cached on disk across processes).

    variant_flags: the -D flags of a build-time kernel variant (kernels/mma_variants.py; bench/mma_variants.py
    times them side by side); None: the build the backend runs (default_flags()).
    """
    return _extension(default_flags() if variant_flags is None else tuple(variant_flags))


def extension_name(variant_flags: tuple[str, ...]) -> str:
    """The module name of a build: the flags enter as a short hash (the cache directory's name repeats the
    module name, and spelled-out flags took the default build's path past Windows' 260 characters)."""
    if not variant_flags:
        return EXTENSION_NAME
    return f"{EXTENSION_NAME}_{hashlib.sha1(' '.join(variant_flags).encode()).hexdigest()[:10]}"


@functools.cache
def _extension(variant_flags: tuple[str, ...]):
    return jit.load_extension(extension_name(variant_flags), SOURCES, extra_cuda_cflags=variant_flags)


MEAN_SCALED_FLAG = "-DVC_MMA_MEAN_SCALED=1"  # the build takes mean / v_scale in float32 (attn_mma_wide.cuh)


def mean_operand(ops: PreparedOperands) -> torch.Tensor:
    """The V-Smooth mean in the form a VC_MMA_MEAN_SCALED build reads: mean / v_scale per tile and
    column, float32 (B,H,n_pad/128,D). Computed as the fp16-mean build computes it in the kernel
    (mean * (1 / v_scale), IEEE fp32 division and product), so both builds restore the same values."""
    # two launches: the reciprocal (IEEE, as the kernel's 1.0f / v_scale) and the product in fp32
    # (the fp16 mean converts exactly on the way in)
    return ops.v_mean * torch.reciprocal(ops.v_scale).unsqueeze(-2)


def v_f16_operand(v_t: torch.Tensor, variant_flags: tuple[str, ...]) -> torch.Tensor:
    """V as a VC_MMA_V_F16 build reads it: the codes' float16 values as the image of the kernel's shared-memory tile,
    (B, H, n_pad / 64, D, 64) (kernels/mma_v_f16.py), one elementwise launch on the current stream."""
    return extension(variant_flags).v_f16(v_t, torch.cuda.current_stream(v_t.device).cuda_stream)


_PAIR_FLAGS: dict[tuple, torch.Tensor] = {}
_PAIR_FLAGS_KEPT = 16  # shapes x devices kept (B * H * slots bytes each)


def pair_restore_flags(batch: int, heads: int, slots: int, device: torch.device) -> Optional[torch.Tensor]:
    """(B, H, slots) uint8 segment-end flags on every second 128-key slot and the last one: with V-Smooth means
    equal in 128-row pairs (VCConfig.v_mean_rows 256) and no segments (head dim 64, or v_mean_merge off), the
    kernel restores each pair's mean once instead of once per tile; the same means, the same sum up to float32
    rounding order. Made once per shape and device and only read. None while a CUDA graph is being captured and
    this shape has none yet: a tensor made inside a capture holds its values only once the graph replays, so the
    kernel restores on every tile there (right, ~3% slower at head dim 64)."""
    key = (batch, heads, slots, device)
    flags = _PAIR_FLAGS.get(key)
    if flags is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        flags = torch.zeros(batch, heads, slots, dtype=torch.uint8, device=device)
        flags[..., 1::2] = 1
        flags[..., -1] = 1
        if len(_PAIR_FLAGS) >= _PAIR_FLAGS_KEPT:
            _PAIR_FLAGS.pop(next(iter(_PAIR_FLAGS)))  # the oldest
        _PAIR_FLAGS[key] = flags
    return flags


def restore_flags(ops: PreparedOperands, config: VCConfig, variant_flags: tuple[str, ...]) -> Optional[torch.Tensor]:
    """The v_seg_end the kernel gets: the operands' segments (VCConfig.v_mean_merge), else with paired means the
    pair flags (pair_restore_flags) for the builds that read flags (the mean-scaled ones), else None (a restore
    on every tile)."""
    if config.v != "vsmooth":
        return None
    if ops.v_seg_end is not None or config.v_mean_rows != 2 * K_BLOCK or MEAN_SCALED_FLAG not in variant_flags:
        return ops.v_seg_end
    b, h, slots = ops.v_mean.shape[:3]
    return pair_restore_flags(b, h, slots, ops.v_mean.device)


def attention_from_operands(ops: PreparedOperands, config: VCConfig, out: torch.Tensor, layout: str,
                            lse: Optional[torch.Tensor] = None, variant_flags: Optional[tuple[str, ...]] = None) -> torch.Tensor:
    """Run the attention kernel on prepared operands into `out` (q's shape in `layout`).

    lse (B,H,N) float32, if given, receives each row's natural-log log-sum-exp of the scores the
    kernel sees: with config.smooth_k those are shifted by q.mean(K)*sm_scale per row (softmax-
    invariant, but the LSE moves by that amount).
    The fp16-partial variant runs on V codes shifted by 2^-8 (kernels/mma_pv_f16.py) and the f16-V variant on V's
    f16 values in its key order (kernels/mma_v_f16.py): made here, so their time includes that pass.
    """
    if variant_flags is None:
        variant_flags = default_flags()
    if mma_pv_f16.uses_shifted_v(variant_flags):
        ops = mma_pv_f16.shifted_v_operands(ops)
    if MEAN_SCALED_FLAG in variant_flags and config.v == "vsmooth":
        ops = dataclasses.replace(ops, v_mean=mean_operand(ops))  # after the shift: its v_scale
    if mma_v_f16.takes_v_f16(variant_flags, ops.v_t.shape[2], config.qk == "fp8", config.v == "vsmooth"):
        ops = dataclasses.replace(ops, v_t=v_f16_operand(ops.v_t, variant_flags))
    extension(variant_flags).attention(
        ops.q_q, ops.q_scale, ops.k_q, ops.k_scale, ops.v_t, ops.v_scale, ops.v_mean,
        to_bhnd(out, layout), lse, ops.n_tokens, config.qk == "fp8", config.p == "expcast",
        config.v == "vsmooth", torch.cuda.current_stream(out.device).cuda_stream,
        # the mean restored at V-Smooth segment ends only (VCConfig.v_mean_merge at head dim 128), or once per pair of
        # tiles where the means are equal in pairs (head dim 64 in speed mode)
        restore_flags(ops, config, variant_flags),
    )
    return out


register(Backend(name="mma", priority=50, constraints=CONSTRAINTS, attend=attention_from_operands,
                 softmax_step_keys=SOFTMAX_STEP_KEYS))
