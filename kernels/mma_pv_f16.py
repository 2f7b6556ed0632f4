"""V operands of the fp16-partial builds of the portable kernel (`-DVC_MMA_PV_F16=1` or `=2`), and their emulation.

That build accumulates each 64-key chunk's PV partial in fp16 registers (kernels/csrc/attn_mma_wide.cuh).
With the contract's V codes (up to 448) one product P * V (P up to 448) already overflows fp16, so
the build runs on V codes shifted by 2^-8 (|code| <= 1.75, a chunk's partial <= 64 * 448 * 1.75 =
50176 < 65504) with v_scale multiplied by 2^8: the same V up to the E4M3 rounding of codes that the
shift moves into the subnormal range (|code| < 4 before the shift, under 1% of the channel amax).
The mean restore (mu / v_scale) and the epilogue (x v_scale) use the new scale as they are.

Numerics differ from the spec (reference.py) by that V rounding and by the fp16 rounding of each
32-key MMA result, so this is a declared variant: tests/test_mma_variants_gpu.py checks it against
reference.py with `quantize_fp8_per_channel_shifted` patched in (the V arithmetic exactly), inside
the same gate; bench/pv_accum_study.py ("fp16-v/256") emulates the fp16 partial's rounding too.
"""
from __future__ import annotations

import dataclasses

import torch

from . import reference
from .operands import PreparedOperands

FLAG_PREFIX = "-DVC_MMA_PV_F16="  # =1: the partial folded by the ALU, =2: by an identity MMA
CODE_SHIFT = 2.0**-8  # V codes x this: max 448 -> 1.75 (kPvF16CodeMax in attn_mma_wide.cuh)
CODE_MAX = reference.E4M3_MAX * CODE_SHIFT
CHUNK_KEYS = 64  # keys per fp16 partial (kChunkKeys)
_SPEC_QUANTIZE_V = reference.quantize_fp8_per_channel  # kept: tests patch the module attribute


def partial_bound(p_max: float = reference.E4M3_MAX) -> float:
    """Largest |PV partial| of one chunk: every product |P * V| <= p_max * CODE_MAX."""
    return CHUNK_KEYS * p_max * CODE_MAX


def shift_codes(codes: torch.Tensor) -> torch.Tensor:
    """E4M3 code values (float or float8_e4m3fn) -> float32 values of E4M3(code * 2^-8)."""
    return reference.fp8_e4m3(codes.float() * CODE_SHIFT)


def uses_shifted_v(variant_flags: tuple[str, ...]) -> bool:
    return any(f.startswith(FLAG_PREFIX) and f != FLAG_PREFIX + "0" for f in variant_flags)


# elements converted at a time by shifted_v_operands: its fp16 temporaries stay ~64 MB whatever V's size
# (the whole V at once took 4 bytes a code more at the peak: ~1.5 GB at Wan2.2-14B 720p, on GeForce cards
# with 16-24 GB where this build runs)
SHIFT_CHUNK_ELEMENTS = 1 << 24


def shifted_v_operands(ops: PreparedOperands, chunk_elements: int = SHIFT_CHUNK_ELEMENTS) -> PreparedOperands:
    """The operands with V codes x 2^-8 and v_scale x 2^8 (new tensors; `ops` is left as it is)."""
    # in fp16 (exact for E4M3 values and their 2^-8 multiples), one rounding to E4M3 at the end:
    # the values of shift_codes, with about a third of the memory traffic of a float32 pass; over
    # slices of (B*H) rows so that the temporaries stay small (one extra byte a code at the peak)
    src = ops.v_t.reshape(-1, ops.v_t.shape[-2] * ops.v_t.shape[-1])
    out = torch.empty_like(src)
    rows = max(1, chunk_elements // max(1, src.shape[1]))
    for start in range(0, src.shape[0], rows):
        part = src[start:start + rows].half()
        out[start:start + rows] = part.mul_(CODE_SHIFT).to(torch.float8_e4m3fn)
    return dataclasses.replace(ops, v_t=out.view_as(ops.v_t), v_scale=ops.v_scale / CODE_SHIFT)


def quantize_fp8_per_channel_shifted(x: torch.Tensor, amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """reference.quantize_fp8_per_channel followed by the shift: what the fp16-partial build's V is
    (patch it over reference.quantize_fp8_per_channel to emulate that build). amax: the spec's optional
    per-channel bound (V-Smooth segments and the low-rank term pass one)."""
    codes, scale = _SPEC_QUANTIZE_V(x, amax)
    return shift_codes(codes), scale / CODE_SHIFT
