"""Numeric constants shared by the Python spec (reference.py) and the CUDA kernels, defined once.

kernels/jit.py hands them to every CUDA build as -D flags (`cuda_defines`, part of the build's
cache key), and csrc/vc_constants.h turns the macros into typed constants, stopping the build with
#error when one is missing: a copy in a .cuh file cannot drift silently (tests/test_constants.py).
"""
from __future__ import annotations

import math

LOG2E = 1.4426950408889634  # scores are kept in log2 units: s = q.k * sm_scale * log2(e)
E4M3_MAX = 448.0  # largest finite E4M3 value (the FP8 V residual's per-channel scale maps amax here)
INT8_MAX = 127.0  # symmetric INT8 codes: -127..127

Q_BLOCK = 64  # query rows per CTA of the portable mma kernel (Q has one scale per row)
K_BLOCK = 128  # key rows sharing one scale; also the V-Smooth block B_v (one KV tile)
V_BLOCK = K_BLOCK

P_LOG2_MAX = 8  # the row offset M maps to 2^8 = 256 (P_MAX), the top of P's range
P_MAX = 2.0**P_LOG2_MAX
E4M3_OCTAVE_CODES = 8  # E4M3 codes per factor of two (3 mantissa bits): the 8 in 8u
E4M3_ONE_CODE = 56  # the E4M3 byte of 1.0 (0x38)
EXPCAST_BETA = -0.35  # centres eps(m) = m - 8 log2(1 + m/8) in the min-max sense (-0.3443 rounded)
EXPCAST_MAX_CODE = E4M3_OCTAVE_CODES * P_LOG2_MAX + E4M3_ONE_CODE  # 120 = 0x78 = 256.0
EXPCAST_BIAS = EXPCAST_MAX_CODE + EXPCAST_BETA  # 119.65: the paper's code = rint(8u + bias) for u = s - M
# The corrected ExpCast (reference.p_expcast) maps the row max to 448 (the E4M3 maximum, code 126): 0.8
# octave more range above the subnormals than 256, at no cost (docs/fidelity-study.md). It holds
# w = u + log2(448) + beta/8 in a float32 near 1536 = 1.5 * 2^10, whose ulp is 2^-13:
# y = u + EXPCAST_ROW_CONSTANT, then its bits shifted by EXPCAST_SHIFT.
EXPCAST_LOG2_SCALE = math.log2(E4M3_MAX)
EXPCAST_P_LOG2_SCALE = EXPCAST_LOG2_SCALE + EXPCAST_BETA / 8  # P ~ 2^(u + this): the kernels' LSE
EXPCAST_TOP_CODE = 126  # 448.0
EXPCAST_FIXED_POINT = 1536.0
EXPCAST_ROW_CONSTANT = EXPCAST_FIXED_POINT + EXPCAST_P_LOG2_SCALE  # float32: 1544.76355
EXPCAST_FLOOR = EXPCAST_FIXED_POINT - 24.0  # w >= -24: 2^w is far below E4M3's smallest code 2^-9
EXPCAST_SHIFT = 10  # 23 mantissa bits - 13 fraction bits

# name in CUDA (VC_<NAME>) -> value; floats are written as float literals
SHARED_WITH_CUDA = {
    "LOG2E": LOG2E,
    "E4M3_MAX": E4M3_MAX,
    "INT8_MAX": INT8_MAX,
    "Q_BLOCK": Q_BLOCK,
    "K_BLOCK": K_BLOCK,
    "P_LOG2_MAX": P_LOG2_MAX,
    "E4M3_OCTAVE_CODES": E4M3_OCTAVE_CODES,
    "E4M3_ONE_CODE": E4M3_ONE_CODE,
    "EXPCAST_MAX_CODE": EXPCAST_MAX_CODE,
    "EXPCAST_BIAS": EXPCAST_BIAS,
    "EXPCAST_BETA": EXPCAST_BETA,
    "EXPCAST_P_LOG2_SCALE": EXPCAST_P_LOG2_SCALE,
    "EXPCAST_ROW_CONSTANT": EXPCAST_ROW_CONSTANT,
    "EXPCAST_FLOOR": EXPCAST_FLOOR,
    "EXPCAST_SHIFT": EXPCAST_SHIFT,
}


def cuda_defines() -> tuple[str, ...]:
    """The -D flags that give the CUDA sources these constants (csrc/vc_constants.h reads them)."""
    return tuple(f"-DVC_{name}={value!r}f" if isinstance(value, float) else f"-DVC_{name}={value}"
                 for name, value in SHARED_WITH_CUDA.items())
