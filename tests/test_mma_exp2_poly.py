"""CPU emulation of the portable kernel's FMA-pipe exp2 for P (`exp2_poly_e4m3` in csrc/p_encoding.cuh, the
VC_MMA_EXP2_POLY variants): its coefficients read from the header, evaluated in float32 with single-rounding FMAs,
the E4M3 codes it yields compared with those of exact exp2 on fidelity-like arguments.

The gate: at most 2e-5 of the codes flip, each by one code (a degree-3 polynomial flips ~3e-4 and fails), and
masked keys (-inf) and arguments far below the row max give code 0.
"""
import re

import numpy as np
import torch

from vc_attention.kernels import jit

from .test_sm90_exp2_poly import arguments, exp2_poly, function_body  # noqa: F401  (arguments: the fixture)
from .test_sm90_exp2_poly import kernel_coefficients as coefficients_of


def kernel_coefficients() -> list[np.float32]:
    """Horner coefficients of exp2_poly_e4m3, highest degree first, as written in the header."""
    text = function_body("exp2_poly_e4m3")
    # the structure the emulation below assumes: clamp, Cody-Waite split, Horner, exponent joined by a multiply-add
    assert "a = fmaxf(a, -120.f);" in text and "const float r = a + 12582912.f;" in text
    assert "return __int_as_float(__float_as_int(r) * (1 << 23) + __float_as_int(p));" in text
    return coefficients_of("exp2_poly_e4m3")


def exp2_poly_e4m3(a: np.ndarray) -> np.ndarray:
    kernel_coefficients()  # (the structure checks: the same emulation as exp2_poly's holds)
    return exp2_poly(a, "exp2_poly_e4m3")


def e4m3_codes(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).int()


def test_polynomial_is_degree_four():
    assert len(kernel_coefficients()) == 5


def test_codes_match_exact_exp2_but_a_few_in_10_to_the_5(arguments):
    ours = e4m3_codes(exp2_poly_e4m3(arguments))
    exact = e4m3_codes(np.exp2(arguments.astype(np.float64)))
    flipped = ours != exact
    assert flipped.float().mean().item() < 2e-5
    assert (ours - exact).abs().max().item() <= 1


def test_masked_and_far_arguments_give_code_zero():
    a = np.array([-np.inf, -1e30, -200.0, -121.0, -20.0], dtype=np.float32)
    assert e4m3_codes(exp2_poly_e4m3(a)).tolist() == [0, 0, 0, 0, 0]
    # the largest argument (the row max: 2^8 = 256) stays exact in E4M3
    assert e4m3_codes(exp2_poly_e4m3(np.array([8.0], dtype=np.float32))).tolist() == e4m3_codes(np.array([256.0])).tolist()


def test_the_portable_kernel_routes_only_the_named_registers():
    """encode_p sends register reg to the polynomial when reg >= 4 - VC_MMA_EXP2_POLY (0: every exponential on MUFU)."""
    text = (jit.CSRC_DIR / "attn_mma.cuh").read_text()
    assert "#define VC_MMA_EXP2_POLY 0" in text
    assert re.search(r"if \(reg >= 4 - VC_MMA_EXP2_POLY\)[^\n]*\n\s*return e4m3x4\(vc_p::exp2_poly_e4m3\(a\[0\]\)", text)
