"""CPU emulation of the kernels' FMA-pipe exp2 (`exp2_poly` in csrc/p_encoding.cuh: the speed path's
online-softmax rescale factor, and the VC_SM90_EXP2_POLY variants of fidelity mode): its coefficients are read from the header itself, evaluated in float32
with single-rounding FMAs, and the E4M3 codes it yields are compared with those of exact exp2.

The gate: the polynomial may flip no more E4M3 codes than MUFU-class error does (a few in 10^7);
a degree-4 polynomial flips ~1.5e-5 of them and fails.
"""
import re

import numpy as np
import pytest
import torch

from vc_attention.kernels import jit

HEADER = jit.CSRC_DIR / "p_encoding.cuh"
MAGIC = np.float32(12582912.0)  # 1.5 * 2^23


def function_body(function: str = "exp2_poly") -> str:
    """The body of `float function(float a)` in the header."""
    body = re.search(r"float " + function + r"\(float a\) \{(.*?)\n\}", HEADER.read_text(), flags=re.S)
    assert body, f"{function} not found in p_encoding.cuh"
    return body.group(1)


def kernel_coefficients(function: str = "exp2_poly") -> list[np.float32]:
    """Horner coefficients of `function` (exp2_poly, or another polynomial written the same way), highest degree
    first, as written in the header."""
    body = function_body(function)
    first = re.search(r"float p = ([0-9.eE+-]+)f;", body)
    rest = re.findall(r"p = fmaf\(p, f, ([0-9.eE+-]+)f\);", body)
    assert first and rest, body
    return [np.float32(first.group(1))] + [np.float32(c) for c in rest]


def fma32(a: np.ndarray, b: np.ndarray, c) -> np.ndarray:
    # float32 products are exact in float64, so one float64 add then one rounding emulates fmaf
    return (a.astype(np.float64) * b.astype(np.float64) + np.float64(c)).astype(np.float32)


def exp2_poly(a: np.ndarray, function: str = "exp2_poly") -> np.ndarray:
    """`function` (exp2_poly, or one written the same way) emulated: clamp, Cody-Waite split, Horner, 2^n added into
    the exponent field (int32 wrap-around, as the kernel's integer add or multiply-add)."""
    a = np.maximum(a.astype(np.float32), np.float32(-120.0))
    r = (a + MAGIC).astype(np.float32)
    f = (a - (r - MAGIC)).astype(np.float32)
    coeffs = kernel_coefficients(function)
    p = np.full_like(a, coeffs[0])
    for c in coeffs[1:]:
        p = fma32(p, f, c)
    return (p.view(np.int32) + (r.view(np.int32) << 23)).view(np.float32)


@pytest.fixture(scope="module")
def arguments() -> np.ndarray:
    # fidelity arguments are s - M + 8 <= 8: the bulk a few units below the row max, a long tail
    rng = np.random.default_rng(0)
    return np.concatenate([rng.uniform(-30.0, 8.0, 2_000_000), 8.0 - rng.exponential(2.0, 2_000_000)]).astype(np.float32)


def test_polynomial_is_degree_five():
    assert len(kernel_coefficients()) == 6


def test_relative_error_is_mufu_class(arguments):
    live = arguments[arguments > -100.0]
    rel = np.abs(exp2_poly(live).astype(np.float64) / np.exp2(live.astype(np.float64)) - 1.0)
    assert rel.max() < 3e-7


def test_rescale_factors_are_mufu_class():
    """alpha = 2^(M_old - M_new) of the exact running max: any non-positive float32 difference; the
    kernels multiply O and l by it, so its relative error is what the output sees (<= 3e-7)."""
    rng = np.random.default_rng(1)
    d = -np.concatenate([rng.exponential(1.0, 1_000_000), rng.uniform(0.0, 100.0, 1_000_000), [0.0]]).astype(np.float32)
    rel = np.abs(exp2_rescale(d).astype(np.float64) / np.exp2(d.astype(np.float64)) - 1.0)
    assert rel.max() < 3e-7
    # the max did not move (most tiles): exactly 1, where the polynomial alone is 1 + 2^-23
    assert exp2_poly(np.array([0.0], dtype=np.float32))[0] != 1.0
    assert exp2_rescale(np.array([0.0, -0.0], dtype=np.float32)).tolist() == [1.0, 1.0]
    assert exp2_rescale(np.array([-np.inf], dtype=np.float32))[0] < 2.0**-119  # before the first tile (O = l = 0)


def exp2_rescale(d: np.ndarray) -> np.ndarray:
    """vc_p::exp2_rescale as written in the header: 1 at d = 0, else exp2_poly."""
    assert re.search(r"float exp2_rescale\(float d\) \{ return d == 0\.f \? 1\.f : exp2_poly\(d\); \}", HEADER.read_text())
    return np.where(d == 0, np.float32(1.0), exp2_poly(d)).astype(np.float32)


def test_e4m3_codes_match_exact_exp2(arguments):
    exact = torch.from_numpy(np.exp2(arguments.astype(np.float64))).to(torch.float8_e4m3fn).view(torch.uint8)
    poly = torch.from_numpy(exp2_poly(arguments)).to(torch.float8_e4m3fn).view(torch.uint8)
    flips = (poly != exact).double().mean().item()
    assert flips < 1e-6, f"{flips:.2e} of the E4M3 codes differ from exact exp2"


def test_masked_and_far_arguments_give_zero_codes():
    a = np.array([-np.inf, -1000.0, -121.0, -30.0], dtype=np.float32)
    codes = torch.from_numpy(exp2_poly(a)).to(torch.float8_e4m3fn).view(torch.uint8)
    assert codes.tolist() == [0, 0, 0, 0]
