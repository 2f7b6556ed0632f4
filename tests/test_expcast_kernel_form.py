"""The kernels' arithmetic for the speed encoding (kernels/csrc/p_encoding.cuh) gives the spec's codes.

The kernels do not compute reference.expcast_bits literally: per row and key block they form the row
constants (expcast_int_row: two float32 roundings for e, F2I.RN for A and T0, a magic-constant
reciprocal and F2I.RZ for the clamp's K), then per element one integer max and one 32-bit IMAD that
wraps modulo 2^32 (expcast_int_float), and the satfinite E4M3 cast. This emulates those steps exactly
in numpy float32 / uint32 over int8 dot products at head dims 64 and 128 and compares every code with
the spec's. The clamp a >= a0 - K is what keeps the wrapping product from turning far-below keys and
masked keys (INT_MIN) into garbage: the variants without it, or with a reciprocal too coarse for its
window, differ (the last tests).
"""
import re

import numpy as np
import pytest
import torch

from vc_attention.kernels import constants
from vc_attention.kernels import jit
from vc_attention.kernels import reference as R

f32 = np.float32
HEADER = (jit.CSRC_DIR / "p_encoding.cuh").read_text()
INT_MIN = -(2**31)


def _header(pattern: str) -> str:
    found = re.search(pattern, HEADER)
    assert found, f"p_encoding.cuh no longer matches {pattern!r}: update this emulation"
    return found.group(1)


def _define(name: str) -> np.float32:
    """The float32 the kernels see for VC_<name> (the -D flag of kernels/constants.py)."""
    defines = dict(flag[len("-D"):].split("=", 1) for flag in constants.cuda_defines())
    return f32(float(defines[f"VC_{name}"].rstrip("f")))


TWO23 = f32(float(_header(r"fminf\(sc \* ([0-9.]+)f, vc::kExpCastSlopeCap\)")))
RECIP_MAGIC = int(_header(r"__uint_as_float\((0x[0-9A-Fa-f]+)u - __float_as_uint\(a_f\)\)"), 16)
WINDOW = float(_header(r"\(t0f - ([0-9.]+)f \* 8388608\.f\) \* inv_a"))
K_MAX = 1 << int(_header(r"int k = min\(max\(__float2int_rz\([^;]*, 0\), 1 << (\d+)\);"))
TOP = _define("EXPCAST_TOP")
SLOPE_CAP = _define("EXPCAST_SLOPE_CAP")
CODE_ZERO_BITS = 117 << 23  # floats below 2^-10 = bits 117 << 23 round to E4M3 code 0


def _f2i(x: np.ndarray, rounding: str) -> np.ndarray:
    """cvt.rni / cvt.rzi.s32.f32: nearest-even or toward zero, saturating to int32, NaN -> 0."""
    x = x.astype(np.float64)
    r = np.rint(x) if rounding == "rn" else np.trunc(x)
    return np.where(np.isnan(r), 0, np.clip(r, INT_MIN, 2**31 - 1)).astype(np.int64)


def _as_float(bits: np.ndarray) -> np.ndarray:
    return (bits & 0xFFFFFFFF).astype(np.uint32).view(f32)


def _as_bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=f32).view(np.uint32).astype(np.int64)


def kernel_row(sc, a0, m, *, recip_error=1.0, window=WINDOW):
    """expcast_int_row: (mul, add, lo) per row, from float32 sc and m and the int32 block max a0."""
    sc, m = np.asarray(sc, dtype=f32), np.asarray(m, dtype=f32)
    a0 = np.asarray(a0, dtype=np.int64)
    e = (a0.astype(f32) * sc) - m  # __fsub_rn(__fmul_rn(float(a0), sc), m)
    a_f = np.minimum(sc * TWO23, SLOPE_CAP)
    a = _f2i(a_f, "rn")
    t0f = (TOP + e) * TWO23  # __fadd_rn, then an exact power-of-two product
    t0 = np.maximum(_f2i(t0f, "rn"), 0)
    inv_a = _as_float(RECIP_MAGIC - _as_bits(a_f)) * f32(recip_error)  # recip_error: study variants only
    k = np.clip(_f2i((t0f - f32(window) * TWO23) * inv_a, "rz"), 0, K_MAX)
    add = (t0 - (a0 & 0xFFFFFFFF) * a) & 0xFFFFFFFF  # uint32 t0 - uint32 a0 * uint32 a
    return a, add, a0 - k


def kernel_floats(acc, sc, a0, m, *, clamp=True, **row):
    """expcast_int_float: the float32 from bits uint32(max(acc, lo)) * mul + add (mod 2^32)."""
    mul, add, lo = kernel_row(sc, a0, m, **row)
    x = np.maximum(acc, lo) if clamp else acc
    return _as_float(((x & 0xFFFFFFFF) * mul + add) & 0xFFFFFFFF)


def cast_satfinite(v: np.ndarray) -> np.ndarray:
    """cvt.rn.satfinite.e4m3x2.f32: nearest-even, beyond +-448 (inf included) saturates, NaN -> 0x7F."""
    nan = np.isnan(v)
    clamped = torch.from_numpy(np.clip(np.where(nan, 0, v), -448, 448).astype(f32))
    codes = clamped.to(torch.float8_e4m3fn).view(torch.uint8).numpy().astype(np.int64)
    return np.where(nan, 0x7F, codes)


def kernel_codes(acc, sc, a0, m, **variant):
    return cast_satfinite(kernel_floats(acc, sc, a0, m, **variant))


def spec_codes(acc, sc, a0, m):
    """reference.expcast_code of the integer scores with the block max a0 and the running max m."""
    t = torch.from_numpy
    return R.expcast_code(None, t(m), acc=t(acc), scale=t(sc), a0=t(a0)).numpy().astype(np.int64)


def _rows(d: int, seed: int, rows: int = 1536, keys: int = 128):
    """(acc, sc, a0, m) for `rows` blocks of `keys` keys: int8 dot products at head dim d (random,
    peaky: keys near the query, and a few all-aligned blocks at the extremes +-d 127^2), masked keys
    (INT_MIN) in some rows, log-uniform scales 1e-6..1e-1, and a running max M at the block max
    fl(a0 sc), just above it (a few ulps), or above it (an earlier block's max, up to 60 log2 units;
    every 50th row 140, past the top of t)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-127, 128, (rows, d))
    k = rng.integers(-127, 128, (rows, keys, d))
    peaky = rng.random(rows) < 0.5  # keys = the query + noise: the scores crowd the block max
    k[peaky] = np.clip(q[peaky, None, :] + rng.integers(-40, 41, (int(peaky.sum()), keys, d)), -127, 127)
    acc = np.einsum("rd,rkd->rk", q, k)
    extreme = d * 127 * 127
    acc[:8] = extreme  # every key at the top of the int32 range of the products
    acc[8:16] = -extreme  # a block at the bottom: its max is -d 127^2
    acc[16:24] = extreme - rng.integers(0, 2 * extreme + 1, (8, keys))  # the whole range below a0 = +extreme
    acc[16:24, 0] = extreme
    masked = rng.random((rows, keys)) < np.where(rng.random((rows, 1)) < 0.2, 0.5, 0.0)
    masked[:, 0] = False  # the block keeps one valid key: a0 is a score
    a0 = np.where(masked, INT_MIN, acc).max(-1, keepdims=True)
    acc = np.where(masked, INT_MIN, acc)
    sc = np.exp(rng.uniform(np.log(1e-6), np.log(1e-1), (rows, 1))).astype(f32)
    m = a0.astype(f32) * sc
    kind = rng.integers(0, 3, (rows, 1))
    kind[::50] = 3  # a block far below the running max: T0 < 0, every code 0
    m = np.where(kind == 1, np.nextafter(m, f32(np.inf)) * f32(1 + 1e-6) + f32(1e-6), m)
    m = np.where(kind == 2, m + rng.uniform(0, 60, (rows, 1)).astype(f32), m).astype(f32)
    m = np.where(kind == 3, m + f32(140), m).astype(f32)
    return acc, sc, a0, m


CASES = [(64, 1), (64, 2), (128, 3), (128, 4)]


@pytest.mark.parametrize("d,seed", CASES)
def test_kernel_form_codes_equal_the_spec(d, seed):
    acc, sc, a0, m = _rows(d, seed)
    extreme = d * 127 * 127
    assert np.abs(acc[acc != INT_MIN]).max() <= extreme and a0.max() == extreme and a0.min() == -extreme
    mine, ref = kernel_codes(acc, sc, a0, m), spec_codes(acc, sc, a0, m)
    assert (mine != ref).sum() == 0, f"{(mine != ref).sum()} of {acc.size} codes differ from the spec"
    # every code range is reached: the top code, subnormals, zeros; masked keys are code 0
    assert mine.max() == R.EXPCAST_TOP_CODE and (mine[(mine > 0) & (mine < 8)]).size > 100
    assert (mine[acc == INT_MIN] == 0).all() and (acc == INT_MIN).sum() > 1000


@pytest.mark.parametrize("d,seed", CASES)
def test_the_clamp_only_touches_code_zero(d, seed):
    """The window's claim, checked on the rows above: t(lo) = T0 - K A lies in [0, 117 2^23), so every
    clamped key (acc < lo) has spec code 0; the clamp does bind on many valid keys."""
    acc, sc, a0, m = _rows(d, seed)
    mul, add, lo = kernel_row(sc, a0, m)
    t_lo = (lo - a0) * mul + np.maximum(_f2i((TOP + (a0.astype(f32) * sc - m)) * TWO23, "rn"), 0)
    assert (t_lo >= 0).all() and (t_lo < CODE_ZERO_BITS).all()
    clamped = (acc < lo) & (acc != INT_MIN)
    assert clamped.sum() > 10_000
    assert (spec_codes(acc, sc, a0, m)[clamped] == 0).all()


def test_a_dense_integer_sweep_below_the_block_max():
    """Every integer acc from a0 down to a0 - 2^20 at scales where that crosses the whole code range
    (u from 0 to -2^20 sc), the running max at and above the block max."""
    acc = (2_000_000 - np.arange(2**20, dtype=np.int64))[None, :]
    for sc in (2e-5, 1.3e-4, 7.7e-4):
        for m_shift in (0.0, 0.37, 11.0):
            s = np.array([[sc]], dtype=f32)
            a0 = np.array([[2_000_000]])
            m = (a0.astype(f32) * s + f32(m_shift)).astype(f32)
            mine, ref = kernel_codes(acc, s, a0, m), spec_codes(acc, s, a0, m)
            assert (mine != ref).sum() == 0, (sc, m_shift)


def _differences(**variant) -> int:
    total = 0
    for d, seed in CASES:
        acc, sc, a0, m = _rows(d, seed)
        total += int((kernel_codes(acc, sc, a0, m, **variant) != spec_codes(acc, sc, a0, m)).sum())
    return total


def test_without_the_clamp_the_wrapping_product_differs():
    """The check above can fail: without max(acc, lo) the 32-bit product wraps for keys far below the
    block max and for masked keys (INT_MIN), giving negative floats and NaN bytes."""
    assert _differences(clamp=False) > 10_000


def test_a_reciprocal_outside_the_window_differs():
    """The window: with K = (T0 - 58.5 2^23) c / A, t(lo) = T0 (1 - c) + 58.5 c 2^23 is in [0, 117 2^23)
    for c in (0.25, 1.75) at the top T0 (135.8 2^23): the 5% reciprocal is well inside, a reciprocal
    off by 1.9x wraps t(lo) below 0 and one off by 0.2x clamps keys with non-zero codes; a window
    offset of 0 (K = T0 / A) leaves t(lo) within 5% of 0, below it half the time."""
    assert _differences(recip_error=1.5) == 0 and _differences(recip_error=0.5) == 0
    assert _differences(recip_error=1.9) > 1000
    assert _differences(recip_error=0.2) > 1000
    assert _differences(window=0.0) > 1000


def test_the_emulated_constants_are_the_headers():
    """The literals read from p_encoding.cuh and the -D constants are what the spec uses."""
    assert TWO23 == 2.0**R.EXPCAST_SLOPE_BITS and SLOPE_CAP == R.EXPCAST_SLOPE_CAP and TOP == f32(R.EXPCAST_TOP)
    a_f = np.exp(np.linspace(np.log(2.0**-10), np.log(2.0**28), 100_001)).astype(f32)
    inv = _as_float(RECIP_MAGIC - _as_bits(a_f)).astype(np.float64)
    assert np.abs(inv * a_f - 1).max() < 0.051  # the "within 5%" the window is sized for


def _two_scale_blocks():
    """One head, 256 keys in two K-scale blocks (the sm90 256-key loop's online-softmax step): block 0
    holds a key at ~20 log2 units above the rest, block 1 one at ~18 plus an outlier key ~9x larger
    and orthogonal to the queries, so block 1's INT8 K scale is ~9x block 0's."""
    g = torch.Generator().manual_seed(0)
    d, n = 128, 256
    u = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0)
    w = torch.randn(d, generator=g)
    w = torch.nn.functional.normalize(w - (w @ u) * u, dim=0)
    q = 3.0 * u + 0.05 * torch.randn(1, 1, n, d, generator=g)
    k = 0.3 * torch.randn(1, 1, n, d, generator=g)
    per_unit = 3.0 / d**0.5 * R.LOG2E  # log2 units of the score of key c u, per c
    k[:, :, 17] = 20.0 / per_unit * u
    k[:, :, 128 + 5] = 0.9 * 20.0 / per_unit * u
    k[:, :, 128 + 40] = 12.0 * 20.0 / per_unit * w
    return q, k


def test_a_256_key_step_anchors_each_scale_block_at_its_own_max(monkeypatch):
    """quantize_p with offset_block = 256 (two K-scale blocks per step): every block's codes are what the
    32-bit kernel form computes from that block's anchor a0. Anchored at the step's max instead, a0 sc of
    the larger-scale block passes the running max M, T0 passes 2^31 and the kernel form's codes (T0
    saturated by F2I) lose that block: the case the spec's per-block anchor exists for. (K scales per 128
    keys: with config.SPEED's 256 one scale and one anchor cover the step, tests/test_k_scale_pairs.py.)"""
    from vc_attention.kernels.config import SPEED

    SPEED = SPEED.with_(k_lane_scales=False, k_scale_rows=128)  # noqa: N806 (the speed encoding with two scale blocks per step)
    q, k = _two_scale_blocks()
    q_q, q_sc, k_q, k_sc = R.quantize_qk(q, k, SPEED)
    assert k_sc.flatten()[1] > 8 * k_sc.flatten()[0]
    acc, sc = R.score_parts(q_q, q_sc, k_q, k_sc, k.shape[-2])
    seen = {}
    original = R.p_expcast
    monkeypatch.setattr(R, "p_expcast", lambda s, m, **kw: seen.update(m=m, **kw) or original(s, m, **kw))
    R.quantize_p(acc * sc, SPEED, 256, acc=acc, scale=sc)
    args = [np.asarray(seen[key].expand_as(acc) if torch.is_tensor(seen[key]) else seen[key], dtype=dtype)
            for key, dtype in (("acc", np.int64), ("scale", f32), ("a0", np.int64), ("m", f32))]
    a_acc, a_sc, a0, m = (x.reshape(-1, 128) for x in np.broadcast_arrays(*args))
    a0_blocks = a0.reshape(-1, 128)[:, :1]
    assert (a0 == a0_blocks).all()  # one anchor per 128-key scale block
    ref = spec_codes(a_acc, a_sc, a0_blocks, m)
    assert (kernel_codes(a_acc, a_sc, a0_blocks, m) == ref).all()
    assert (ref > 0).sum() > 500
    # the step-wide anchor: what a 32-bit T0 would make of it
    step_a0 = np.maximum(a0_blocks.reshape(-1, 2), a0_blocks.reshape(-1, 2)[:, ::-1]).reshape(-1, 1)
    step_ref = spec_codes(a_acc, a_sc, step_a0, m)
    assert (kernel_codes(a_acc, a_sc, step_a0, m) != step_ref).sum() > 100
