"""ExpCast accuracy variants, emulated: candidate P encodings for the speed (ALU-only) softmax path.

Every encoder maps u = s - M (log2 units, M the running row max, so u <= 0 and the row max has
u = 0) to the float32 VALUES of E4M3 codes, like reference.p_exp2_cast and reference.p_expcast.
Scale: 2^(u+8) (row max 256) unless the name says 448 (row max 448); the scale cancels in the softmax normalization, so only the rounding differs.
Each docstring gives the per-element instruction sequence a kernel would use and its cost:
"ALU" counts FP32 FMA-pipe and integer/logic ops (FFMA, FMNMX, LOP3, LEA, PRMT), "cvt" the
F2FP E4M3 conversion (one instruction packs two elements), "MUFU" the special-function unit.
Packing four codes into an A-fragment register costs about 0.5-0.75 PRMT per element on every
path and is left out of the counts. None of them uses F2I or a branch.

bench/expcast_study.py measures them (docs/kernel-notes.md, "ExpCast accuracy variants");
tests/test_expcast_variants.py checks codes, monotonicity and agreement with the paper's ExpCast.

Why the subnormal range matters: ExpCast codes 1..7 are E4M3 subnormals worth c * 2^-9, not the
intended 2^((c-56)/8), and u < -14.9 encodes to 0 while the exact cast keeps values down to
u = -18. At long sequence lengths much probability mass sits there (FINDINGS.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..kernels import reference as ref

LOG2_448 = math.log2(ref.E4M3_MAX)
# 8 u + 8*log2(448) + 56 + beta = 126.108 at u = 0: the row max gets code 126 = 448.0.
EXPCAST_448_MAX_CODE = 126

# Fixed-point exponent trick (bits_cast): y = u + offset is held in a float32 near 1536 = 1.5 * 2^10,
# whose ulp is 2^-13, so the low 23 mantissa bits are 2^22 + (y - 1536) * 2^13. LEA shifts them left
# by 10 and adds 127 << 23: bit 22 and the exponent field fall off the top, leaving the float32 whose
# exponent field is 127 + floor(y - 1536) and whose mantissa is frac(y - 1536) (a piecewise-linear
# 2^(y - 1536) in every octave). 1512 clamps y - 1536 >= -24, far below the E4M3 underflow (2^-10).
FIXED_POINT_MAGIC = 1536.0
FIXED_POINT_FLOOR = 1512.0
FRACTION_MASK = (1 << 13) - 1  # the 13 fraction bits of y below 2^-0
FLOAT32_1024_BITS = 0x44800000  # 1024.0f: OR-ing 13 fraction bits into it gives 1024 + frac exactly
# 2^f ~ 1 + f - c f (1 - f) on [0, 1): c = 0.34 keeps the relative error under 0.27% (min-max c = 0.3398).
QUADRATIC_C = 0.34

SUBNORMAL_LAST_CODE = 8  # the exact cast's codes 1..8 below the ExpCast normal range (t < 7.5)


def _f32(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fl32(a * b + c) with one rounding, as FFMA: the float32 product is exact in float64."""
    return (a.double() * b.double() + c.double()).float()


def _linear_code(u: torch.Tensor, offset: float) -> torch.Tensor:
    """t = fl32(8 u + offset): the ExpCast code before rounding (8 u is exact, one rounding)."""
    return u.float() * 8.0 + _f32(offset)


def _codes_to_values(codes: torch.Tensor) -> torch.Tensor:
    return codes.to(torch.uint8).view(torch.float8_e4m3fn).float()


# ----------------------------------------------------------------------------------------------
# baselines
def exp2_cast(u: torch.Tensor) -> torch.Tensor:
    """Fidelity path (= reference.p_exp2_cast): P = E4M3(exp2(u + 8)).

    Kernel: FFMA (s * 1 - M + 8, row constant), MUFU.EX2, F2FP.E4M3 pack of two.
    Cost per element: 1 ALU + 1 MUFU + 0.5 cvt.
    """
    return ref.p_exp2_cast(u)


def exp2_cast_448(u: torch.Tensor) -> torch.Tensor:
    """exp2 + cast with the row max at 448: P = E4M3(exp2(u + log2 448)), float32 exp2, RNE cast.

    Same instructions as exp2_cast (only the row constant differs): 1 ALU + 1 MUFU + 0.5 cvt.
    """
    return ref.fp8_e4m3(torch.exp2(u.float() + _f32(LOG2_448)))


def paper(u: torch.Tensor) -> torch.Tensor:
    """The paper's ExpCast (= reference.p_expcast_paper, the speed path before the fix): code = clip_[0,120](rint(8u + 119.65)).

    Kernel: x = FFMA.SAT(s, 8/256, (119.65 - 8M)/256) in [0, 1]; y = FFMA(x, 256, 1.5*2^23), whose
    low byte is rint(256 x) (round-half-even); the byte is the E4M3 code.
    Cost per element: 2 ALU, no MUFU, no cvt.
    """
    return ref.p_expcast_paper(u)


# ----------------------------------------------------------------------------------------------
# fixes for the subnormal range (codes < 8, u < -14)
def subnormal_exact(u: torch.Tensor) -> torch.Tensor:
    """Paper's ExpCast where t = 8u + 119.65 >= 7.5; below, the exact cast's subnormal code.

    Exact cast of 2^(u+8) below 2^-6: code m = rint(2^(u+17)), i.e. m >= k iff u >= log2(k - 1/2) - 17,
    i.e. t >= T_k = 8 log2(k - 1/2) - 16.35 (k = 1..8; float32 constants). So
    code = t >= 7.5 ? rint(t) : sum_k [t >= T_k].
    Kernel: 8 FSET.GE.BF (1.0f or 0.0f per threshold) + 7 FADD + FSETP + FSEL on top of the paper's
    2 ops (the linear code t must be kept unsaturated for the compares).
    Cost per element: about 19 ALU (a branch-free 4-level select tree would be about 10).
    """
    offset = 8 * ref.P_LOG2_MAX + 56 + ref.EXPCAST_BETA
    t = _linear_code(u, offset)
    ks = range(1, SUBNORMAL_LAST_CODE + 1)
    thresholds = torch.tensor([8 * math.log2(k - 0.5) - 136 + offset for k in ks], dtype=torch.float32)
    sub_code = (t.unsqueeze(-1) >= thresholds).sum(-1)
    normal_code = torch.round(t).clamp(0, ref.EXPCAST_MAX_CODE).to(torch.int64)
    return _codes_to_values(torch.where(t >= 7.5, normal_code, sub_code))


def paper_ftz(u: torch.Tensor) -> torch.Tensor:
    """Paper's ExpCast with the mis-decoded subnormal codes 1..7 flushed to 0 (t < 7.5 -> 0).

    Kernel: the paper's 2 ops + ISETP on the code byte + SEL: 4 ALU. Drops the tail instead of
    mis-weighting it (codes 1..7 decode too LOW already, so this can only lose more mass).
    """
    codes = ref.expcast_paper_code(u)
    return _codes_to_values(torch.where(codes < 8, torch.zeros_like(codes), codes))


def _fixed_point_y(u: torch.Tensor, offset: float) -> torch.Tensor:
    """y = max(fl32(u + fl32(1536 + offset)), 1512): FFMA(s, 1, row constant) then FMNMX."""
    return torch.clamp(u.float() + _f32(FIXED_POINT_MAGIC + offset), min=FIXED_POINT_FLOOR)


def _exponent_bits_to_float(y: torch.Tensor) -> torch.Tensor:
    """float32 with bits (bits(y) << 10) + (127 << 23) mod 2^32 = 2^floor(w) (1 + frac(w)), w = y - 1536:
    bit 22 and y's exponent fall off the top, the 8 integer bits of w land in the exponent field."""
    bits = y.view(torch.int32).to(torch.int64)
    return (((bits << 10) + (127 << 23)) & 0xFFFFFFFF).to(torch.int32).view(torch.float32)


def bits_cast(u: torch.Tensor) -> torch.Tensor:
    """ExpCast through float32 exponent bits and the hardware E4M3 cast (Schraudolph-style exp2).

    y = max(fl32(u + fl32(1536 + 8 + beta/8)), 1512), a fixed-point number with 13 fraction bits;
    v = float32 with bits (bits(y) << 10) + (127 << 23) = 2^floor(w) (1 + frac(w)), w = u + 8 + beta/8;
    P = E4M3(v) (RNE, satfinite). In the normal E4M3 range the code is rint(8w + 56) = the paper's
    rint(8u + 119.65) up to the position of rounding boundaries (u resolved to 2^-13 here); in the
    subnormal range the cast rounds the piecewise-linear 2^w to multiples of 2^-9, which fixes codes
    1..7 and keeps values down to u = -18 (the beta shift centres the chord's +6% overshoot).
    Kernel: FFMA (s + row constant), FMNMX (floor 1512), LEA (shift 10, add 127<<23), F2FP.E4M3 pack.
    Cost per element: 3 ALU + 0.5 cvt, no MUFU. Its 448 form (bits_cast_448) was the speed path's encoding.
    """
    y = _fixed_point_y(u, ref.P_LOG2_MAX + ref.EXPCAST_BETA / 8)
    return ref.fp8_e4m3(_exponent_bits_to_float(y))


def bits_cast_448(u: torch.Tensor) -> torch.Tensor:
    """bits_cast with the row max at 448: w = u + log2(448) + beta/8; at u = 0 the float is
    2^8 (1 + 0.763) = 451.3, which the satfinite cast rounds to 448 (code 126), never NaN.
    Same instructions as bits_cast: 3 ALU + 0.5 cvt. The speed path's encoding before its integer form:
    reference.p_expcast holds the same w in integer fixed point, to 2^-23 instead of 2^-13."""
    return ref.fp8_e4m3(_exponent_bits_to_float(_fixed_point_y(u, ref.EXPCAST_P_LOG2_SCALE)))


# ----------------------------------------------------------------------------------------------
# mantissa corrections
def bits_cast_quadratic(u: torch.Tensor) -> torch.Tensor:
    """bits_cast with a second-order mantissa correction: the cast sees 2^w to 0.27%, not 6%.

    With y as in bits_cast (beta = 0: the correction is already centred) and f = frac(y) (its 13
    fraction bits): y' = y - c f (1 - f), c = 0.34, so 1 + frac(y') = 1 + f - c f(1-f) ~ 2^f.
    Kernel: FFMA, FMNMX (y); LOP3 (bits(y) & 0x1FFF | bits(1024.0f)) = 1024 + f exactly; FADD -1024
    (f); FFMA (g = c - c f); FFMA (y' = y - f g); LEA; F2FP pack.
    Cost per element: 7 ALU + 0.5 cvt, no MUFU (a software exp2 feeding the hardware cast).
    """
    y = _fixed_point_y(u, float(ref.P_LOG2_MAX))
    frac_bits = (y.view(torch.int32) & FRACTION_MASK) | FLOAT32_1024_BITS
    f = frac_bits.view(torch.float32) - _f32(1024.0)
    g = _fma(f, _f32(-QUADRATIC_C), _f32(QUADRATIC_C))
    y_corr = _fma(-f, g, y)
    return ref.fp8_e4m3(_exponent_bits_to_float(y_corr))


# ----------------------------------------------------------------------------------------------
# P range 448
def paper_448(u: torch.Tensor) -> torch.Tensor:
    """The paper's ExpCast with the row max at 448: code = clip_[0,126](rint(8u + 8 log2 448 + 55.65)).

    Same two instructions as paper (other constants; the low byte stays <= 126, never the NaN 127).
    Cost per element: 2 ALU.
    """
    t = _linear_code(u, 8 * LOG2_448 + 56 + ref.EXPCAST_BETA)
    return _codes_to_values(torch.round(t).clamp(0, EXPCAST_448_MAX_CODE))


# ----------------------------------------------------------------------------------------------
# ALU-only subnormal fix: no conversion instruction (no F2FP, F2I, MUFU)
# t = 8u + 8 log2(448) + 56 + beta is paper_448's linear code (126.09 at u = 0). Where t >= 8 the
# E4M3 code is rint(t); below, the true (subnormal) code of the chord 2^w, w = t/8 - 7, is
# rint(2^(w+9)) on the chord: 4 + t/2 on [0, 8), 4 + t/4 on [-8, 0), 3 + t/8 on [-16, -8), a convex
# piecewise-linear function. A convex function is the max of its pieces, and every piece lies at or
# below the line rint(t) where t >= 8 and above it where t < 8, so code = max(rint(t), rint(L_j(t)))
# with rint applied by the magic-number FFMA (rint commutes with max): no select, no table.
ALU_MAGIC = 12582912.0  # 1.5 * 2^23: float32 ulp 1, so x + MAGIC holds rint(x) (ties to even) in its low bits
ALU_T_OFFSET = 8 * LOG2_448 + 56 + ref.EXPCAST_BETA  # paper_448's t at u = 0 (126.09)
ALU_X_SPAN = 256.0  # x = sat((t - floor) / 256): the paper's FFMA.SAT argument, floor shifted down
# (slope, intercept) of each chord piece in t, steepest first: the E4M3 subnormal octaves
ALU_CHORD_LINES = ((0.5, 4.0), (0.25, 4.0), (0.125, 3.0))


def _alu_lines(u: torch.Tensor, n_lines: int) -> torch.Tensor:
    """code = max(rint(t), rint(L_1(t)), ..., rint(L_n(t))) with t floored where L_n reaches 0."""
    lines = ALU_CHORD_LINES[:n_lines]
    slope, intercept = lines[-1]
    t_floor = -intercept / slope  # L_n(t_floor) = 0: below it every code is 0
    # FFMA.SAT(s, sc/32, (t_offset - t_floor - 8M)/256); from u the product u/32 is exact
    x = _fma(u.float(), _f32(8.0 / ALU_X_SPAN), _f32((ALU_T_OFFSET - t_floor) / ALU_X_SPAN)).clamp(0.0, 1.0)
    # t = 256 x + t_floor; every product below is exact and every added constant an integer
    code = _fma(x, _f32(ALU_X_SPAN), _f32(ALU_MAGIC + t_floor))
    for slope, intercept in lines:
        line = _fma(x, _f32(ALU_X_SPAN * slope), _f32(ALU_MAGIC + intercept + slope * t_floor))
        code = torch.maximum(code, line)
    return _codes_to_values((code - _f32(ALU_MAGIC)).to(torch.int64))


def alu_line(u: torch.Tensor) -> torch.Tensor:
    """paper_448 with one chord line for the top subnormal octave: max(rint(t), rint(4 + t/2)), t >= -8.

    Codes equal bits_cast_448's for t >= 0 (u >= -15.76) up to rounding-boundary position; t in
    [-8, 0) gets the line 4 + t/2 (codes 0..4, under the true chord 2..4), below -8 code 0.
    Kernel: x = FFMA.SAT(s, sc/32, row constant) (as the paper); N = FFMA(x, 256, MAGIC - 8);
    L = FFMA(x, 128, MAGIC); FMNMX(N, L); the low byte is the E4M3 code; PRMT packs four.
    Cost per element: 4 ALU, no MUFU, no cvt (3 FFMA + 1 FMNMX).
    """
    return _alu_lines(u, 1)


def alu_lines2(u: torch.Tensor) -> torch.Tensor:
    """alu_line with the second subnormal octave: max(rint(t), rint(4 + t/2), rint(4 + t/4)), t >= -16.

    Equals bits_cast_448 for t >= -8 (u >= -16.76) up to rounding-boundary position; [-16, -8)
    gets codes 0..2 on the line 4 + t/4 (true chord 1..2), below code 0.
    Kernel: x = FFMA.SAT(s, sc/32, row constant); N = FFMA(x, 256, MAGIC - 16);
    L1 = FFMA(x, 128, MAGIC - 4); L2 = FFMA(x, 64, MAGIC); 2 FMNMX; PRMT packs four.
    Cost per element: 6 ALU, no MUFU, no cvt (4 FFMA + 2 FMNMX).
    """
    return _alu_lines(u, 2)


def alu_lines3(u: torch.Tensor) -> torch.Tensor:
    """alu_lines2 with the third subnormal octave (3 + t/8 on [-16, -8)), t >= -24.

    Equals bits_cast_448 for t >= -16 (u >= -17.76) up to rounding-boundary position; [-24, -16)
    gets codes 0..1 on the line 3 + t/8 (true chord 0.5..1 rounds to 0..1 too, at other points).
    Kernel: x = FFMA.SAT; N, L1, L2, L3 by FFMA (magic constants); 3 FMNMX; PRMT packs four.
    Cost per element: 8 ALU, no MUFU, no cvt (5 FFMA + 3 FMNMX).
    """
    return _alu_lines(u, 3)


# ----------------------------------------------------------------------------------------------
# MUFU / ALU split
def _mufu_columns(n: int, device) -> torch.Tensor:
    """Columns given to MUFU exp2 in the hybrids: column pairs 0, 2, 4, ... (columns 4i and 4i+1),
    i.e. half the elements, one F2FP pair each; the other pairs take the ALU encoding."""
    j = torch.arange(n, device=device)
    return (j // 2) % 2 == 0


def hybrid_paper(u: torch.Tensor) -> torch.Tensor:
    """Half the elements (every other column pair) exp2 + cast, the other half the paper's ExpCast.

    Both target 2^(u+8), so the mix is consistent within a row. Cost per element (average):
    0.5 x (1 ALU + 1 MUFU + 0.5 cvt) + 0.5 x 2 ALU = 1.5 ALU + 0.5 MUFU + 0.25 cvt.
    """
    return torch.where(_mufu_columns(u.shape[-1], u.device), exp2_cast(u), paper(u))


def hybrid_bits(u: torch.Tensor) -> torch.Tensor:
    """Half the elements exp2 + cast, the other half bits_cast (both use the F2FP cast).

    Cost per element (average): 0.5 x (1 ALU + 1 MUFU) + 0.5 x 3 ALU + 0.5 cvt = 2 ALU + 0.5 MUFU + 0.5 cvt.
    """
    return torch.where(_mufu_columns(u.shape[-1], u.device), exp2_cast(u), bits_cast(u))


# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """One P encoding with its kernel cost per element (see the module docstring for the units)."""

    name: str
    encode: Callable[[torch.Tensor], torch.Tensor]
    alu: float
    mufu: float
    cvt: float
    note: str


VARIANTS = {
    v.name: v
    for v in (
        Variant("exp2_cast", exp2_cast, 1, 1, 0.5, "fidelity path (MUFU exp2 + cast)"),
        Variant("exp2_cast_448", exp2_cast_448, 1, 1, 0.5, "fidelity path, row max at 448"),
        Variant("paper", paper, 2, 0, 0, "the paper's ExpCast (p=expcast_paper)"),
        Variant("paper_ftz", paper_ftz, 4, 0, 0, "paper, codes 1..7 flushed to 0"),
        Variant("subnormal_exact", subnormal_exact, 19, 0, 0, "paper + exact subnormal codes by thresholds"),
        Variant("bits_cast", bits_cast, 3, 0, 0.5, "exponent-bit exp2 (linear mantissa) + E4M3 cast"),
        Variant("bits_cast_quadratic", bits_cast_quadratic, 7, 0, 0.5, "bits_cast + quadratic mantissa correction"),
        Variant("paper_448", paper_448, 2, 0, 0, "paper, row max at 448 (max code 126)"),
        Variant("bits_cast_448", bits_cast_448, 3, 0, 0.5, "bits_cast, row max at 448 (p=expcast to 2^-13)"),
        Variant("alu_line", alu_line, 4, 0, 0, "paper_448 + chord line for the top subnormal octave"),
        Variant("alu_lines2", alu_lines2, 6, 0, 0, "paper_448 + two subnormal chord lines"),
        Variant("alu_lines3", alu_lines3, 8, 0, 0, "paper_448 + three subnormal chord lines"),
        Variant("hybrid_paper", hybrid_paper, 1.5, 0.5, 0.25, "half exp2 + cast, half paper"),
        Variant("hybrid_bits", hybrid_bits, 2, 0.5, 0.5, "half exp2 + cast, half bits_cast"),
    )
}


def quantize_p_with(s: torch.Tensor, encode: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """reference.quantize_p with any encoder of u: each key block encoded at u = float32(s - M) against
    its running offset M (the exact running max), rescaled by 2^(M_running - M_final). Returns
    unnormalized P, float64. The spec's speed encoding anchors each block at its largest score instead
    (T0 from fl(a0 scale) - M); with reference.p_expcast as the encoder the two agree wherever s - M is
    exact (tests/test_expcast_variants.py)."""
    run = ref.running_row_offsets(s)
    m_run = run.repeat_interleave(ref.K_BLOCK, dim=-1)[..., : s.shape[-1]]
    p = encode(s - m_run)
    return p.double() * torch.exp2(m_run.double() - run[..., -1:].double())
