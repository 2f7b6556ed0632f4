"""The speed path's P encoding (reference.p_expcast, p="expcast"): bit-exact against an independent
float64 derivation of its definition, monotone, exactly decodable, and within per-range error bounds
of the ideal 2^(u+8) that the paper's ExpCast (p="expcast_paper") breaks in the subnormal range."""
import math
import re

import pytest
import torch

from vc_attention.kernels import jit
from vc_attention.kernels import reference as R

SUBNORMAL_QUANTUM = 2.0**-9  # E4M3's smallest code and the spacing of its subnormals
NORMAL_MIN = 2.0**-6


LOG2_SCALE = math.log2(448.0)  # the row max maps to 448, the largest E4M3 value


def _float32_row_constant() -> float:
    """1536 + log2(448) + beta/8 rounded to float32 (spacing 2^-13 on [1024, 2048), ties to even)."""
    exact = 1536 + LOG2_SCALE + R.EXPCAST_BETA / 8
    return round(exact * 2**13) / 2**13


def _e4m3_round(v: torch.Tensor) -> torch.Tensor:
    """Round non-negative float64 values to E4M3 (nearest, ties to even, saturating at 448)."""
    exponent = torch.frexp(v).exponent - 1  # v = m 2^exponent with m in [1, 2)
    quantum = torch.exp2((exponent.clamp(min=-6) - 3).double())  # 3 mantissa bits; subnormals 2^-9
    return torch.minimum(torch.round(v / quantum) * quantum, torch.tensor(448.0, dtype=torch.float64))


def _e4m3_byte(v: torch.Tensor) -> torch.Tensor:
    """The E4M3 byte of an exact E4M3 value (non-negative), by its exponent and mantissa fields."""
    exponent = torch.frexp(v).exponent - 1
    normal = v >= NORMAL_MIN
    field = torch.where(normal, exponent + 7, torch.zeros_like(exponent))
    mantissa = torch.where(normal, (v / torch.exp2(exponent.double()) - 1) * 8, v / SUBNORMAL_QUANTUM)
    return (field * 8 + mantissa.round().long()).to(torch.int32)


def _definition(u: torch.Tensor) -> torch.Tensor:
    """The encoding's definition in float64: w = u + log2(448) + beta/8 rounded to 13 fraction bits
    (as the float32 sum with the row constant does), floored at -24; P = E4M3(2^floor(w) (1 + frac(w)))."""
    y = torch.round((u.double() + _float32_row_constant()) * 2**13) / 2**13
    w = torch.clamp(y, min=R.EXPCAST_FLOOR) - R.EXPCAST_FIXED_POINT
    return _e4m3_round(torch.exp2(torch.floor(w)) * (1 + w - torch.floor(w)))


def _u_samples() -> torch.Tensor:
    """float32 u <= 0: a dense sweep, random values, every point of the 2^-13 grid near rounding
    boundaries of w (half-grid offsets included) and the masked-key -inf."""
    gen = torch.Generator().manual_seed(0)
    grid = torch.arange(-25 * 2**13, 1, dtype=torch.float64) / 2**13
    return torch.cat([
        torch.linspace(-30, 0, 400001),
        -torch.rand(200000, generator=gen) * 30,
        grid.float(),
        (grid[:-1] + 2.0**-14).float(),
        torch.tensor([0.0, -math.inf]),
    ])


def test_codes_equal_the_definition_bit_for_bit():
    u = _u_samples()
    want = _definition(u)
    assert torch.equal(R.p_expcast(u).double(), want)
    assert torch.equal(R.expcast_code(u), _e4m3_byte(want))


def test_the_row_constant_is_the_float32_the_kernels_use():
    assert float(torch.tensor(R.EXPCAST_ROW_CONSTANT, dtype=torch.float32)) == _float32_row_constant()
    assert _float32_row_constant() == 1544.7635498046875


def test_anchor_codes():
    u = torch.tensor([0.0, -LOG2_SCALE, -8.0, -14.8, -16.8, -18.3, -19.0, -math.inf])
    # u = 0: 2^8 (1 + 0.764) = 451.6 saturates to 448 (code 126); u = -log2 448: 0.978 rounds to 1.0
    # (code 56); 448 2^-16.8 = 2^-8: subnormal code 2
    assert R.expcast_code(u).tolist() == [126, 56, 62, 8, 2, 1, 0, 0]


def test_monotone_in_u():
    u = torch.sort(_u_samples()).values
    codes = R.expcast_code(u)
    assert bool((codes[1:] >= codes[:-1]).all())
    assert codes[-1] == R.EXPCAST_TOP_CODE and codes[0] == 0


def test_decode_is_exact():
    u = _u_samples()
    codes = R.expcast_code(u)
    assert torch.equal(R.decode_e4m3(codes), R.p_expcast(u))
    assert torch.equal(codes.to(torch.uint8).view(torch.float8_e4m3fn).float(), R.p_expcast(u))


def _definition_against_offset(s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The kernels' form with a non-integer running max M: the row constant C - M rounded to the
    2^-13 grid (float32 on [1024, 2048)), then s added and rounded once more (fmaf(acc, sc, C - M))."""
    row = torch.round((_float32_row_constant() - m.double()) * 2**13) / 2**13
    y = torch.round((s.double() + row) * 2**13) / 2**13
    w = torch.clamp(y, min=R.EXPCAST_FLOOR) - R.EXPCAST_FIXED_POINT
    return _e4m3_round(torch.exp2(torch.floor(w)) * (1 + w - torch.floor(w)))


def test_codes_against_a_non_integer_offset_equal_the_definition_bit_for_bit():
    gen = torch.Generator().manual_seed(1)
    m = (torch.randn(400000, generator=gen) * 40).float()  # exact running maxima: any float32
    s = m - torch.rand(400000, generator=gen) * 30
    s[::1000] = m[::1000]  # the row max itself: code 126
    want = _definition_against_offset(s, m)
    assert torch.equal(R.p_expcast(s, m).double(), want)
    assert bool((R.expcast_code(s[::1000], m[::1000]) == R.EXPCAST_TOP_CODE).all())


# ---------------------------------------------------------------- error bounds against exp2
# each encoding with the log2 of the value its row max maps to: ranges are relative to that scale
ENCODINGS = {"expcast": (R.p_expcast, LOG2_SCALE), "expcast_paper": (R.p_expcast_paper, 8.0)}
# normal range: at most half a code of rounding plus the linear mantissa's |eps - beta| <= 0.35 codes
NORMAL_REL_BOUND = 2 ** ((0.5 + 0.35) / 8) - 1  # 7.6%
# subnormal range: half a quantum of rounding plus the chord of 2^w, about 0.24 quanta at most
SUBNORMAL_ABS_BOUND = 0.75 * SUBNORMAL_QUANTUM


def _errors(name, lo: float, hi: float):
    """u over [lo, hi) + the octave shift of the encoding's scale (lo, hi given for a 2^8 scale), the
    encoded values and the ideal 2^(u + log2 scale)."""
    encode, log2_scale = ENCODINGS[name]
    u = torch.linspace(lo, hi, 400001)[:-1] + (8.0 - log2_scale)
    ideal = torch.exp2(u.double() + log2_scale)
    return u, encode(u).double(), ideal


def _normal_range_ok(name) -> bool:
    _, got, ideal = _errors(name, -14.0, 0.0)
    return bool(((got - ideal).abs() / ideal <= NORMAL_REL_BOUND).all())


def _subnormal_range_ok(name) -> bool:
    """2^(u + log2 scale) in [2^-10, 2^-6), below E4M3's normal range: absolute error within the
    bound, and no probability above half the smallest code lost (the exact cast keeps those)."""
    _, got, ideal = _errors(name, -18.0, -14.0)
    kept = (got > 0) | (ideal <= SUBNORMAL_QUANTUM / 2 * 1.05)
    return bool(((got - ideal).abs() <= SUBNORMAL_ABS_BOUND).all() and kept.all())


def _underflow_ok(name) -> bool:
    _, got, ideal = _errors(name, -40.0, -18.05)
    return bool((got == 0).all() and (ideal <= SUBNORMAL_QUANTUM / 2).all())


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_normal_range_relative_error(name):
    assert _normal_range_ok(name)


def test_subnormal_range_absolute_error():
    assert _subnormal_range_ok("expcast")


def test_the_paper_encoding_fails_the_subnormal_bound():
    """The bound can fail: the paper's codes 1..7 decode as c 2^-9 instead of 2^((c-56)/8) and
    u < -14.9 encodes to 0, errors of up to 4.3 quanta."""
    assert not _subnormal_range_ok("expcast_paper")
    _, got, ideal = _errors("expcast_paper", -18.0, -14.0)
    assert (got - ideal).abs().max() > 4 * SUBNORMAL_QUANTUM


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_underflow_range_is_zero(name):
    assert _underflow_ok(name)


@pytest.mark.parametrize("name,top", [("expcast", 448.0), ("expcast_paper", 256.0)])
def test_the_row_max_lands_in_the_top_octave(name, top):
    encode, _ = ENCODINGS[name]
    got = encode(torch.tensor([0.0, -0.999])).tolist()
    assert got[0] == top and top / 2 * 0.95 < got[1] < top


def test_a_long_row_keeps_its_tail_mass():
    """A row with every key below the normal range (2^-10 to 2^-6 of the scale's 2^8; long video
    rows): the corrected encoding keeps the tail's probability mass within 5%, the paper's loses most."""
    r = torch.rand(4096, generator=torch.Generator().manual_seed(2)) * 4
    for name, keeps in (("expcast", True), ("expcast_paper", False)):
        encode, log2_scale = ENCODINGS[name]
        u = -14.0 - r + (8.0 - log2_scale)
        ratio = encode(u).double().sum() / torch.exp2(u.double() + log2_scale).sum()
        assert (abs(ratio - 1) < 0.05) if keeps else (ratio < 0.8)


def test_the_kernel_header_reads_the_spec_constants():
    """kernels/csrc/p_encoding.cuh takes the encoding's constants from the build's -D flags
    (kernels/constants.py, one definition); nvcc rounds each float literal once, to the float32
    value the reference uses."""
    from vc_attention.kernels import constants

    header = (jit.CSRC_DIR / "p_encoding.cuh").read_text()
    for name in ("kExpCastRowConstant", "kExpCastFloor", "kExpCastShift", "kExpCastPLog2Scale", "kExpCastBias"):
        assert f"vc::{name}" in header, name
    defines = dict(flag[len("-D"):].split("=", 1) for flag in constants.cuda_defines())
    as_float32 = float(torch.tensor(float(defines["VC_EXPCAST_ROW_CONSTANT"].rstrip("f")), dtype=torch.float32))
    assert as_float32 == _float32_row_constant()
    assert float(defines["VC_EXPCAST_FLOOR"].rstrip("f")) == R.EXPCAST_FLOOR
    scale = float(torch.tensor(LOG2_SCALE + R.EXPCAST_BETA / 8, dtype=torch.float32))
    assert float(torch.tensor(float(defines["VC_EXPCAST_P_LOG2_SCALE"].rstrip("f")), dtype=torch.float32)) == scale
    assert int(defines["VC_EXPCAST_SHIFT"]) == R.EXPCAST_SHIFT == 10
