"""The speed path's P encoding (reference.p_expcast, p="expcast"): bit-exact against an independent
numpy derivation of its integer fixed point (int64 arithmetic, the float32 and E4M3 decoded by hand),
monotone, exactly decodable, and within per-range error bounds of the ideal 2^(u+8) that the paper's
ExpCast (p="expcast_paper") breaks in the subnormal range."""
import math

import numpy as np
import pytest
import torch

from vc_attention.kernels import jit
from vc_attention.kernels import reference as R

SUBNORMAL_QUANTUM = 2.0**-9  # E4M3's smallest code and the spacing of its subnormals
NORMAL_MIN = 2.0**-6


LOG2_SCALE = math.log2(448.0)  # the row max maps to 448, the largest E4M3 value
FRACTION_BITS = 23  # t = 2^23 (w + 127): one unit of w is one unit of the float32 exponent field
SLOPE_CAP = 2**28


def _top_float32() -> np.float32:
    """127 + log2(448) + beta/8 rounded once to float32: t / 2^23 at the row max."""
    return np.float32(127 + LOG2_SCALE + R.EXPCAST_BETA / 8)


def _definition_t(acc, scale, a0, m) -> np.ndarray:
    """The spec's fixed point in numpy: t = T0 + (acc - a0) A, exact in int64 for integer acc (float64
    then rounded once for the float scores of the scale-1 form), with A = rint(min(fl(scale 2^23), 2^28))
    and T0 = rint(fl(TOP + fl(fl(a0 scale) - M)) 2^23), every fl a float32 rounding."""
    f32 = np.float32
    scale, a0, m = (np.asarray(x, dtype=f32) for x in (scale, a0, m))
    e = (a0 * scale) - m  # numpy float32: each operation rounds once
    slope = np.rint(np.minimum(scale * f32(2**FRACTION_BITS), f32(SLOPE_CAP))).astype(np.int64)
    top = np.rint((_top_float32() + e).astype(np.float64) * 2**FRACTION_BITS).astype(np.int64)
    acc = np.asarray(acc)
    if np.issubdtype(acc.dtype, np.integer):
        return top + (acc.astype(np.int64) - a0.astype(np.int64)) * slope
    with np.errstate(invalid="ignore"):
        t = np.rint(top + (acc.astype(np.float64) - a0.astype(np.float64)) * slope)
    return np.where(np.isfinite(t), t, -1).astype(np.int64)  # a masked key (-inf): t < 0


def _chord_value(t: np.ndarray) -> np.ndarray:
    """The float32 with bits max(t, 0), decoded by hand in float64: 2^(E - 127) (1 + F / 2^23) from
    the exponent field E and fraction F, the subnormal F 2^-149 for E = 0."""
    t = np.maximum(t, 0)
    field, frac = t >> 23, t & (2**23 - 1)
    normal = np.ldexp(1.0 + frac / 2.0**23, (field - 127).astype(np.int32))
    return np.where(field > 0, normal, np.ldexp(frac.astype(np.float64), -149))


def _e4m3_round(v: np.ndarray) -> np.ndarray:
    """Round non-negative float64 values to E4M3 (nearest, ties to even, saturating at 448)."""
    exponent = np.frexp(v)[1] - 1  # v = m 2^exponent with m in [1, 2)
    quantum = np.ldexp(1.0, np.maximum(exponent, -6) - 3)  # 3 mantissa bits; subnormals 2^-9
    return np.minimum(np.round(v / quantum) * quantum, 448.0)  # np.round: ties to even


def _e4m3_byte(v: np.ndarray) -> np.ndarray:
    """The E4M3 byte of an exact E4M3 value (non-negative), by its exponent and mantissa fields."""
    exponent = np.frexp(v)[1] - 1
    normal = v >= NORMAL_MIN
    field = np.where(normal, exponent + 7, 0)
    mantissa = np.where(normal, (v / np.ldexp(1.0, exponent) - 1) * 8, v / SUBNORMAL_QUANTUM)
    return (field * 8 + np.round(mantissa).astype(np.int64)).astype(np.int32)


def _definition(acc, scale=1.0, a0=None, m=0.0) -> np.ndarray:
    """P of the spec, float64 (a0 None: the row max of acc, as p_expcast without acc)."""
    acc = np.asarray(acc)
    if a0 is None:
        a0 = acc.max(axis=-1, keepdims=True)
    return _e4m3_round(_chord_value(_definition_t(acc, scale, a0, m)))


def _ties(field: int) -> list[int]:
    """The t whose float32 (exponent field `field`) lies halfway between two E4M3 values: E4M3 keeps
    3 fraction bits for normals (field >= 121), one fewer per octave below; at field 117 the tie is
    2^-10 itself (between 0 and 2^-9), below it every float rounds to 0."""
    kept = 3 - max(0, 121 - field)
    if kept < 0:
        return [field << 23] if kept == -1 else []
    return [(field << 23) + (j << (23 - kept)) + (1 << (22 - kept)) for j in range(1 << kept)]


def _u_samples() -> torch.Tensor:
    """float32 u <= 0 (the exact scores of the scale-1 form, row max 0): a dense sweep, random values,
    the t of every E4M3 rounding tie (and one unit either side) in the normal and subnormal range,
    and the masked-key -inf."""
    gen = torch.Generator().manual_seed(0)
    top = int(np.rint(np.float64(_top_float32()) * 2**FRACTION_BITS))
    ties = np.array([t for field in range(100, 136) for t in _ties(field)], dtype=np.int64)
    ties = np.concatenate([ties - 1, ties, ties + 1])
    u_ties = torch.from_numpy((ties - top).astype(np.float64) / 2**FRACTION_BITS).float()
    return torch.cat([
        torch.linspace(-30, 0, 400001),
        -torch.rand(200000, generator=gen) * 30,
        u_ties[u_ties <= 0],
        torch.tensor([0.0, -math.inf]),
    ])


def test_codes_equal_the_definition_bit_for_bit():
    u = _u_samples()
    want = _definition(u.numpy())
    assert np.array_equal(R.p_expcast(u).double().numpy(), want)
    assert np.array_equal(R.expcast_code(u).numpy(), _e4m3_byte(want))


def test_the_samples_hit_rounding_ties():
    """The tie samples above are representable: some t land exactly on an E4M3 midpoint."""
    v = _chord_value(_definition_t(_u_samples().numpy(), 1.0, 0.0, 0.0))
    exponent = np.frexp(v)[1] - 1
    quantum = np.ldexp(1.0, np.maximum(exponent, -6) - 3)
    assert ((v / quantum) % 1 == 0.5).sum() > 100


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


def _decode_by_hand(codes: np.ndarray) -> np.ndarray:
    field, mantissa = codes >> 3, codes & 7
    return np.where(field > 0, np.ldexp(1.0 + mantissa / 8.0, field - 7), mantissa * SUBNORMAL_QUANTUM)


def test_decode_is_exact():
    u = _u_samples()
    codes = R.expcast_code(u)
    assert np.array_equal(_decode_by_hand(codes.numpy()), R.p_expcast(u).double().numpy())
    assert torch.equal(R.decode_e4m3(codes), R.p_expcast(u))
    assert torch.equal(codes.to(torch.uint8).view(torch.float8_e4m3fn).float(), R.p_expcast(u))


def _int_rows(rows: int, keys: int, scale_lo: float, scale_hi: float, seed: int):
    """int8 dot products at D = 128 (exact integers), a float32 scale per row in [scale_lo, scale_hi),
    a0 the row's largest and M = fl(a0 scale) moved up by up to 3 (an earlier block's larger max)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-127, 128, (rows, 128))
    k = rng.integers(-127, 128, (keys, 128))
    acc = q @ k.T
    scale = rng.uniform(scale_lo, scale_hi, (rows, 1)).astype(np.float32)
    a0 = acc.max(-1, keepdims=True)
    m = (a0.astype(np.float32) * scale) + (rng.random((rows, 1)) * 3 * (rng.random((rows, 1)) < 0.5)).astype(np.float32)
    return acc, scale, a0, m


def test_integer_codes_equal_the_definition_bit_for_bit():
    acc, scale, a0, m = _int_rows(64, 4000, 1e-5, 3e-3, seed=1)
    got = R.p_expcast(None, torch.from_numpy(m), acc=torch.from_numpy(acc), scale=torch.from_numpy(scale),
                      a0=torch.from_numpy(a0))
    want = _definition(acc, scale, a0, m)
    assert np.array_equal(got.double().numpy(), want)
    assert want.max() == 448.0 and (want == 0).any() and ((want > 0) & (want < NORMAL_MIN)).any()


def test_integer_codes_agree_with_the_float_scores_within_the_slope_rounding():
    """With a realistic scale (~1e-4) the integer form's slope A / 2^23 differs from scale by up to
    2^-24 (A's rounding); its codes lie between those of the float-score form (s = fl(acc scale),
    scale 1, u held to 2^-23) at t -+ the bound |acc - a0| / 2 + 2 + |s| 2^-24 2^23 (A, T0 and s
    rounded), and differ from them somewhere (the bound is used)."""
    acc, scale, a0, m = _int_rows(64, 4000, 0.8e-4, 1.5e-4, seed=2)
    s = acc.astype(np.float32) * scale
    t_float = _definition_t(s, 1.0, s.max(-1, keepdims=True), m)
    bound = np.ceil(np.abs(acc - a0) / 2 + 2 + np.abs(s.astype(np.float64)) / 2).astype(np.int64)
    low = _e4m3_byte(_e4m3_round(_chord_value(t_float - bound)))
    high = _e4m3_byte(_e4m3_round(_chord_value(t_float + bound)))
    codes = R.expcast_code(None, torch.from_numpy(m), acc=torch.from_numpy(acc), scale=torch.from_numpy(scale),
                           a0=torch.from_numpy(a0)).numpy()
    assert ((codes >= low) & (codes <= high)).all()
    float_codes = R.expcast_code(torch.from_numpy(s), torch.from_numpy(m)).numpy()
    assert np.array_equal(float_codes, _e4m3_byte(_e4m3_round(_chord_value(t_float))))
    differ = codes != float_codes
    assert differ.any() and differ.mean() < 0.05 and np.abs(codes - float_codes).max() == 1


def test_codes_against_a_non_integer_offset_equal_the_definition_bit_for_bit():
    gen = torch.Generator().manual_seed(1)
    m = (torch.randn(400000, 1, generator=gen) * 40).float()  # exact running maxima: any float32
    s = m - torch.rand(400000, 1, generator=gen) * 30
    s[::1000] = m[::1000]  # the row max itself: code 126
    a0 = m.clone()  # a0 = M: the block holds the running max
    a0[::2] = s[::2]  # or the block max is this score, below M
    want = _definition(s.numpy(), 1.0, a0.numpy(), m.numpy())
    assert np.array_equal(R.p_expcast(s, m, acc=s, scale=1.0, a0=a0).double().numpy(), want)
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
    for name in ("kExpCastTop", "kExpCastSlopeCap", "kExpCastPLog2Scale", "kExpCastBias"):
        assert f"vc::{name}" in header, name
    defines = dict(flag[len("-D"):].split("=", 1) for flag in constants.cuda_defines())

    def as_float32(name):
        return np.float32(float(defines[name].rstrip("f")))

    assert as_float32("VC_EXPCAST_TOP") == _top_float32() == np.float32(R.EXPCAST_TOP)
    assert float(_top_float32()) == 135.76361083984375
    assert as_float32("VC_EXPCAST_SLOPE_CAP") == SLOPE_CAP == R.EXPCAST_SLOPE_CAP
    assert R.EXPCAST_SLOPE_BITS == FRACTION_BITS and "8388608.f" in header  # 2^23 in the kernel's row constants
    assert as_float32("VC_EXPCAST_P_LOG2_SCALE") == np.float32(LOG2_SCALE + R.EXPCAST_BETA / 8)
