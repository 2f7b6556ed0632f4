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
# octave more range above the subnormals than 256, at no cost (docs/fidelity-study.md). Its probability is
# the float32 whose bits are t = 2^23 (w + 127), w = u + log2(448) + beta/8 (the chord 2^floor(w)(1 + frac w)),
# held in integer fixed point: t = T0 + (a - a0) A with a the exact integer score, a0 the block's largest,
# A = rint(scale 2^23) and T0 = rint((EXPCAST_TOP + a0 scale - M) 2^23) (reference.expcast_bits).
EXPCAST_LOG2_SCALE = math.log2(E4M3_MAX)
EXPCAST_P_LOG2_SCALE = EXPCAST_LOG2_SCALE + EXPCAST_BETA / 8  # P ~ 2^(u + this): the kernels' LSE
EXPCAST_TOP_CODE = 126  # 448.0
EXPCAST_TOP = 127.0 + EXPCAST_P_LOG2_SCALE  # float32 135.76361: t / 2^23 of the row max (u = 0)
EXPCAST_SLOPE_BITS = 23  # t per log2 unit = 2^23: one unit of the float32 exponent field
# A is capped at 2^28 (32 log2 units per integer step): every code a larger slope could change is 0
EXPCAST_SLOPE_CAP = 2.0**28
# The mixed encoding (reference.p="mixed"): exp2 + cast for the first keys of every online-softmax step and the
# ExpCast chord for its last MIXED_CHORD_EIGHTHS eighths, so only part of the step's probabilities take the MUFU. Its
# exp2 keys put the row max at 448 as the chord does (one row sum and one PV accumulator hold both kinds of P).
MIXED_P_LOG2_MAX = EXPCAST_LOG2_SCALE
# 8 (the chord for every key on fidelity's paired-K exp2 loop): the split the H100 measured fastest, 111.8 against
# 139.0 ms at Wan2.2-14B for +2.3% / +1.2% rel-L2 at 32,760 / 75,600 tokens (docs/kernel-notes.md section 38)
MIXED_CHORD_EIGHTHS = 8
# The channels of the V residual's second term (VCConfig.v_lo_channels) that the Hopper product library's fidelity
# kernel takes per call (csrc sm90_launch.cu refined_kernels: beside the kernel without it, as p="mixed" beside "exp2").
# 30: the step's two row sums ride in the term's 32-row box (n = 160 instead of 168); with the term's running sum in
# registers the H100 measured -1.4% / -3.3% / -3.0% at Wan2.2-14B / 1.3B / HunyuanVideo against 32 channels for +0.8%
# of fidelity's rel-L2 (docs/kernel-notes.md sections 41-42)
SM90_V_LO_CHANNELS = 30

# V-Smooth's low-rank term rides in the PV MMA's spare output columns: the 8 extra V^T rows after the
# D channel rows (n = D + 8) hold E4M3 ones in row 0 for even 128-key tiles and in row 1 for odd ones (the
# row sums of the two tiles of a 256-key step stay apart) and the coefficient codes in rows 2..7
V_LOW_ROWS = 8
V_LOW_FIRST = 2  # the first coefficient row
MAX_V_RANK = V_LOW_ROWS - V_LOW_FIRST

# The Hopper forward's vsmooth argument is 0 (per-channel V), 1 (V-Smooth) or 2 (its means equal in 128-row
# pairs); V-Smooth's 1 and 2 may add this bit: the K scales are equal in 128-key pairs (VCConfig.k_scale_rows
# 256), which fidelity's exp2 256-key loop then reads once per step (backend_sm90.vsmooth_mode)
VSMOOTH_PAIRED_K = 4
# ... and on top of the paired-K bit this one: the K scales are per MMA lane (VCConfig.k_lane_scales; k_scale holds four
# per 128-key slot), which the paired-K loops then read per lane
VSMOOTH_K_LANES = 8

# VCConfig.k_lane_scales: the four lanes of an MMA quad each hold a fixed quarter of a tile's keys in both kernels'
# score layouts (csrc key_of_column: key 16 c' + 4 t + 2 e' + e belongs to lane t), so one K scale per lane class
# costs no per-score work. Key j's lane is (j % K_LANE_PERIOD) // K_LANE_KEYS (kernels/k_lanes.py)
K_LANES = 4
K_LANE_KEYS = 4  # consecutive keys of one lane
K_LANE_PERIOD = K_LANES * K_LANE_KEYS  # 16: the lane pattern repeats every 16 keys

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
    "EXPCAST_TOP": EXPCAST_TOP,
    "EXPCAST_SLOPE_CAP": EXPCAST_SLOPE_CAP,
    "MIXED_P_LOG2_MAX": MIXED_P_LOG2_MAX,
    "MIXED_CHORD_EIGHTHS": MIXED_CHORD_EIGHTHS,
    "SM90_V_LO_CHANNELS": SM90_V_LO_CHANNELS,
    "V_LOW_ROWS": V_LOW_ROWS,
    "V_LOW_FIRST": V_LOW_FIRST,
    "VSMOOTH_PAIRED_K": VSMOOTH_PAIRED_K,
    "VSMOOTH_K_LANES": VSMOOTH_K_LANES,
    "K_LANES": K_LANES,
    "K_LANE_KEYS": K_LANE_KEYS,
}


def cuda_defines() -> tuple[str, ...]:
    """The -D flags that give the CUDA sources these constants (csrc/vc_constants.h reads them)."""
    return tuple(f"-DVC_{name}={value!r}f" if isinstance(value, float) else f"-DVC_{name}={value}"
                 for name, value in SHARED_WITH_CUDA.items())
