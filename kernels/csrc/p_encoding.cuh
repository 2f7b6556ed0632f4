// The speed path's P encoding (reference.p_expcast), per element, for every attention kernel.
// Torch-free; needs sm_89+ for the E4M3 conversion. No MUFU, no I2F and no F2I per element: one
// integer max and one IMAD on the raw int32 score accumulator, one F2FP.E4M3 per two elements
// (expcast_int_row / expcast_int_float below; the definition is reference.expcast_bits).
//
// Compile-time variant VC_EXPCAST_PAPER=1: the paper's ExpCast (reference.p_expcast_paper), for
// timing comparisons only; its subnormal codes mis-decode (docs/kernel-notes.md).
// Compile-time variant VC_EXPCAST_ALU=1: study/expcast_variants.alu_lines2 (VC_EXPCAST_ALU_LINES=2,
// the default; 1 and 3 select alu_line / alu_lines3), the same row max (448) and normal-range codes
// with no conversion instruction at all: x = FFMA.SAT (as the paper), then
// code = max(rint(t), rint(4 + t/2), rint(4 + t/4)[, rint(3 + t/8)]) for t = 256 x + floor =
// 8u + 126.09, each rint a magic-number FFMA and the max one FMNMX per line; the lines are the chord
// of the E4M3 subnormal octaves. With 2 lines it equals the spec's codes for u >= -16.76 up to
// rounding-boundary position (3 lines: u >= -17.76); timing candidate.
#pragma once
#include <climits>
#include <cstdint>

#include "vc_constants.h"

#ifndef VC_EXPCAST_PAPER
#define VC_EXPCAST_PAPER 0
#endif
#ifndef VC_EXPCAST_ALU
#define VC_EXPCAST_ALU 0
#endif
#ifndef VC_EXPCAST_ALU_LINES
#define VC_EXPCAST_ALU_LINES 2
#endif
#if VC_EXPCAST_ALU_LINES < 1 || VC_EXPCAST_ALU_LINES > 3
#error "VC_EXPCAST_ALU_LINES is the number of subnormal chord lines: 1, 2 or 3"
#endif
#if VC_EXPCAST_PAPER && VC_EXPCAST_ALU
#error "VC_EXPCAST_PAPER and VC_EXPCAST_ALU select different encodings; set at most one"
#endif
// the paper's encoding and the ALU lines pack the code bytes themselves; the spec's encoding casts
#define VC_EXPCAST_BYTE_CODES (VC_EXPCAST_PAPER || VC_EXPCAST_ALU)
// the spec's encoding works on the integer scores (expcast_int_row / expcast_int_float); the byte-code
// variants on a float argument (expcast_row / expcast_arg)
#define VC_EXPCAST_INT (!VC_EXPCAST_BYTE_CODES)

namespace vc_p {

// the constants come from kernels/constants.py through vc_constants.h (one definition)
#if VC_EXPCAST_PAPER
constexpr float kExpCastLog2Scale = vc::kPLog2Max + vc::kExpCastBeta / 8.f;  // P ~ 2^(u + this)
#else
constexpr float kExpCastLog2Scale = vc::kExpCastPLog2Scale;  // P ~ 2^(u + this), for the LSE
#endif

#if VC_EXPCAST_ALU
// t = 8u + 8 log2(448) + 56 + beta (126.09 at u = 0) = 256 x + kAluTFloor, x = sat((t - kAluTFloor) / 256)
constexpr float kAluTOffset = 8.f * vc::kExpCastPLog2Scale + 56.f;
constexpr int kAluLines = VC_EXPCAST_ALU_LINES;
// where the flattest chord line reaches 0: 4 + t/2 at -8, 4 + t/4 at -16, 3 + t/8 at -24
constexpr float kAluTFloor = kAluLines == 1 ? -8.f : (kAluLines == 2 ? -16.f : -24.f);
constexpr float kAluMagic = 12582912.f;  // 1.5 * 2^23: float32 ulp 1, the low byte of x + magic is rint(x)
#endif

#if VC_EXPCAST_BYTE_CODES
// Per-row constants of u = x * sc - m: one multiply-add per element with them.
struct ExpCastRow {
  float mul, add;
};

__device__ __forceinline__ ExpCastRow expcast_row(float sc, float m) {
#if VC_EXPCAST_PAPER
  // (8u + 119.65) / 256, saturated to [0, 1] by the FMA; the scaling by 2^-8 is exact
  return {sc * (1.f / 32.f), (vc::kExpCastBias - 8.f * m) * (1.f / 256.f)};
#elif VC_EXPCAST_ALU
  // (t - kAluTFloor) / 256 = (8u + 126.09 + 16) / 256, saturated to [0, 1] by the FMA
  return {sc * (1.f / 32.f), (kAluTOffset - kAluTFloor - 8.f * m) * (1.f / 256.f)};
#endif
}

// What a masked key's argument is set to (it encodes to code 0 in every encoding).
__device__ __forceinline__ float expcast_masked_arg() { return 0.f; }

// The saturated argument in [0, 1] (every encoding starts from it; NaN saturates to 0).
__device__ __forceinline__ float expcast_arg(float x, const ExpCastRow& row) {
  float d;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(x), "f"(row.mul), "f"(row.add));
  return d;
}

#if VC_EXPCAST_PAPER
// 256 * arg + 1.5*2^23 leaves rint(256 arg) (ties to even) in the low mantissa byte: the code
__device__ __forceinline__ uint32_t code_bits(float arg) { return __float_as_uint(fmaf(arg, 256.f, 12582912.f)); }
#elif VC_EXPCAST_ALU
// rint(t) and rint of each chord line as magic floats (products exact, constants integers): floats
// of one binade compare like their low bytes, so the max is the code (t < 8: a chord line wins;
// t >= 8: rint(t)). x = 0 (masked, or t <= floor) puts the flattest line at 0: code 0.
__device__ __forceinline__ uint32_t code_bits(float x) {
  float code = fmaf(x, 256.f, kAluMagic + kAluTFloor);
  code = fmaxf(code, fmaf(x, 128.f, kAluMagic + 4.f + 0.5f * kAluTFloor));
  if (kAluLines >= 2) code = fmaxf(code, fmaf(x, 64.f, kAluMagic + 4.f + 0.25f * kAluTFloor));
  if (kAluLines >= 3) code = fmaxf(code, fmaf(x, 32.f, kAluMagic + 3.f + 0.125f * kAluTFloor));
  return __float_as_uint(code);
}
#endif
#endif  // VC_EXPCAST_BYTE_CODES

#if VC_EXPCAST_INT
// The spec's encoding (reference.expcast_bits). Per row and key block, with a0 the block's largest
// integer score (the int32 MMA accumulator), sc the row's float32 score scale and M the running max:
//   t(a) = T0 + (a - a0) A,  A = rint(min(sc 2^23, 2^28)),  T0 = rint(fl(127 + log2(448) + beta/8 + fl(fl(a0 sc) - M)) 2^23)
// is 2^23 (w + 127) in fixed point: the float32 with those bits is the chord 2^floor(w) (1 + frac(w))
// and the hardware cast rounds it to E4M3 (t <= 0: code 0). Per element that is one IMAD on the raw
// accumulator (no I2FP, no FFMA; the float form it replaced needed I2FP + FFMA.SAT + FFMA + IMAD:
// sm90 loop 665 -> 557 instructions per warp and tile at head dim 128, docs/kernel-notes.md 14)
// and one integer max: the clamp a >= a_lo keeps t in [0, T0] (no wrap of the 32-bit product).
// a_lo = a0 - K with T0 - K A in [0, 117 2^23): every float there is below 2^-10, code 0, so the clamp
// changes no code; K comes from a 5%-accurate reciprocal (the window is +-76% wide) and one F2I per
// row and block. Masked keys: INT_MIN, which the clamp turns into code 0.
struct ExpCastIntRow {
  uint32_t mul, add;
  int lo;
};
// What a row's constants and its clamp bound share: the slope before rounding (a_f) and T0 before rounding (t0f).
struct ExpCastIntBase {
  float a_f, t0f;
};
__device__ __forceinline__ ExpCastIntBase expcast_int_base(float sc, int a0, float m) {
  // <= 0 (a0 is this K-scale block's own max, sc its scale): how far that max is below the running max;
  // rounded twice as the spec rounds it (no FFMA contraction: fl(fl(a0 sc) - M), the product being the
  // block max the running max took)
  const float e = __fsub_rn(__fmul_rn(static_cast<float>(a0), sc), m);
  return {fminf(sc * 8388608.f, vc::kExpCastSlopeCap), __fadd_rn(vc::kExpCastTop, e) * 8388608.f};
}
// The clamp bound a_lo (expcast_int_row computes it unless kWithLo is false: the clamp-bound kernels take it only on
// the path that clamps, VC_EXPCAST_CLAMP_BOUND / VC_MMA_CLAMP_BOUND).
__device__ __forceinline__ int expcast_int_lo(const ExpCastIntBase& base, int a0) {
  const float a_f = base.a_f, t0f = base.t0f;
  const float inv_a = __uint_as_float(0x7EF311C7u - __float_as_uint(a_f));  // 1/a_f within 5%
  const int k = min(max(__float2int_rz((t0f - 58.5f * 8388608.f) * inv_a), 0), 1 << 30);
  return a0 - k;
}
__device__ __forceinline__ int expcast_int_lo(float sc, int a0, float m) {
  return expcast_int_lo(expcast_int_base(sc, a0, m), a0);
}
template <bool kWithLo = true>
__device__ __forceinline__ ExpCastIntRow expcast_int_row(float sc, int a0, float m) {
  const ExpCastIntBase base = expcast_int_base(sc, a0, m);
  const int a = __float2int_rn(base.a_f);
  const int t0 = max(__float2int_rn(base.t0f), 0);
  const int lo = kWithLo ? expcast_int_lo(base, a0) : INT_MIN;  // INT_MIN: not computed (never read)
  return {static_cast<uint32_t>(a), static_cast<uint32_t>(t0) - static_cast<uint32_t>(a0) * static_cast<uint32_t>(a), lo};
}
// With K scales per lane (VCConfig.k_lane_scales) a lane may have no valid key in a tail tile: its anchor a0 is INT_MIN
// and, where the whole K-scale block has none of its keys, its scale 0, so expcast_int_row's slope is 0 and every code
// would be T0 (P of a score 0) instead of 0 for its masked keys. Such a row takes the constants that give code 0 to
// every score: slope 0, offset 0 (the spec: masked keys have P 0).
template <bool kWithLo = true>
__device__ __forceinline__ ExpCastIntRow expcast_int_row_lane(float sc, int a0, float m) {
  return a0 == INT_MIN ? ExpCastIntRow{0u, 0u, INT_MIN} : expcast_int_row<kWithLo>(sc, a0, m);
}
__device__ __forceinline__ float expcast_int_float(int s, const ExpCastIntRow& r) {
  return __uint_as_float(static_cast<uint32_t>(max(s, r.lo)) * r.mul + r.add);
}
// FP8 QK (the portable kernel's slow path): the scores are float32 sums, not integers. The same t
// with the product and its rounding in float32: T0 + rint(fl(fl(acc - a0) A)), clamped at 0 before
// the conversion (one F2I per element; the FP8 MMA's own summation order differs from the spec's
// float64 sum anyway, so this path is held to the GPU gate, not to bit equality).
struct ExpCastFloatRow {
  float a0, slope, neg_top;
  int top;
};
__device__ __forceinline__ ExpCastFloatRow expcast_float_row(float sc, float a0, float m) {
  const float e = __fsub_rn(__fmul_rn(a0, sc), m);
  const float slope = rintf(fminf(sc * 8388608.f, vc::kExpCastSlopeCap));
  const int top = max(__float2int_rn(__fadd_rn(vc::kExpCastTop, e) * 8388608.f), 0);
  return {a0, slope, -static_cast<float>(top), top};
}
__device__ __forceinline__ float expcast_float_acc(float acc, const ExpCastFloatRow& r) {
  // d <= 0 (a0 is the step's max); clamped at -top, so t >= 0 (top is the rint of a float32, hence
  // exactly a float32 itself: -top is exact); a masked key (-inf) gets t = 0, code 0
  const float d = fmaxf(__fmul_rn(__fsub_rn(acc, r.a0), r.slope), r.neg_top);
  return __int_as_float(r.top + __float2int_rn(d));
}
// The same without the clamp: only for scores known to be >= r.lo (the sm90 kernel checks per warp and
// tile, VC_EXPCAST_CLAMP_CHECK).
__device__ __forceinline__ float expcast_int_float_unclamped(int s, const ExpCastIntRow& r) {
  return __uint_as_float(static_cast<uint32_t>(s) * r.mul + r.add);
}
// The clamp checks by a bound instead of the row minima (VC_EXPCAST_CLAMP_BOUND, VC_MMA_CLAMP_BOUND): whether no
// score s >= -bound of a row (scale sc, running max m after this step) wraps its t = (s - a0) A + T0 below 0. Then
// the clamp changes no code: it only lifts t to t(lo) >= 0, and every t in [0, t(lo)] is a float below 2^-10, code 0.
// Sufficient, in the log domain: with A <= sc 2^23 + 1/2 (rint, or the cap below it) and T0 >= (Top + a0 sc - m)
// 2^23 - 1/2 (rint of expcast_int_row's t0f; a0 sc - m rounded twice, ~1e-6), (a0 + bound) A <= T0 follows from
// bound sc + m <= Top - 1/4 whenever a0 + bound < 2^22 (|a0| <= bound = 128 sum |q_d| <= 2^21); the test keeps a
// whole unit of margin, which also covers this FFMA's own rounding. bound_f: the bound as a float (exact, < 2^24).
__device__ __forceinline__ bool expcast_int_no_wrap(float bound_f, float sc, float m) {
  return fmaf(bound_f, sc, m) <= vc::kExpCastTop - 1.f;
}
#endif
// An upper bound of |s| for every INT8 score of one query row: |sum_d q_d k_d| <= 128 sum_d |q_d| with |k_d| <= 128.
// `row`: the row's D code bytes in shared memory, in any order of 16-byte chunks (the kernels' swizzles permute
// chunks within a row); the quad's four threads (t = lane % 4) each sum a quarter, two shuffles add them up.
// __vabsss4 saturates -128 to 127, so each byte counts as |q_d| + 1 >= |q_d|.
template <int D>
__device__ __forceinline__ int int8_row_score_bound(const uint8_t* row, int t) {
  const uint4* bytes = reinterpret_cast<const uint4*>(row + t * (D / 4));
  int sum = D / 4;  // the +1 per byte of this thread's quarter
#pragma unroll
  for (int i = 0; i < D / 64; ++i) {
    const uint4 w = bytes[i];
    sum = __dp4a(static_cast<int>(__vabsss4(w.x)), 0x01010101, sum);
    sum = __dp4a(static_cast<int>(__vabsss4(w.y)), 0x01010101, sum);
    sum = __dp4a(static_cast<int>(__vabsss4(w.z)), 0x01010101, sum);
    sum = __dp4a(static_cast<int>(__vabsss4(w.w)), 0x01010101, sum);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  return 128 * sum;
}

// 2^a on the FMA pipe, to keep work off MUFU.EX2 (quarter rate; the speed path's rescale factor and
// the VC_SM90_EXP2_POLY variants of fidelity mode): a = n + f with n = rint(a) read
// from the low mantissa bits of a + 1.5*2^23, 2^f on [-0.5, 0.5] by a degree-5 polynomial fitted for
// relative error (7.5e-8, 2.3e-7 in float32), 2^n added into the exponent field. Emulated on 8M
// arguments (docs/kernel-notes.md): E4M3 codes differ from those of exact exp2 in 1.3e-7 of the
// cases, MUFU-class. Arguments below -120 (masked -inf included) give 2^-120, which is E4M3 zero.
__device__ __forceinline__ float exp2_poly(float a) {
  a = fmaxf(a, -120.f);
  const float r = a + 12582912.f;
  const float f = a - (r - 12582912.f);
  float p = 1.3276375e-3f;
  p = fmaf(p, f, 9.6755151e-3f);
  p = fmaf(p, f, 5.5507135e-2f);
  p = fmaf(p, f, 2.4022120e-1f);
  p = fmaf(p, f, 6.9314694e-1f);
  p = fmaf(p, f, 1.0000001f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(r) << 23));
}

// 2^a to E4M3 precision on the FMA pipe (VC_MMA_EXP2_POLY, the portable kernel's exp2 + cast path): the Cody-Waite
// split of exp2_poly with a degree-4 polynomial (relative error 2.6e-6 on [-0.5, 0.5]; fitted for relative error,
// float32 coefficients), and 2^n joined by one integer multiply-add. Emulated on 8M arguments in [-20, 8]: E4M3
// codes differ from those of exact exp2 in 8.4e-6 of the cases, by one code (docs/kernel-notes.md 48). Eight
// FMA-pipe instructions and one IMAD against one MUFU.EX2 (a quarter-rate pipe): slower where MUFU is not the limit
// (the portable kernel on an H100, kernel-notes 48). a = -inf (a masked key) and a < -120 give 2^-120, E4M3 zero.
__device__ __forceinline__ float exp2_poly_e4m3(float a) {
  a = fmaxf(a, -120.f);
  const float r = a + 12582912.f;
  const float f = a - (r - 12582912.f);
  float p = 9.5700957e-3f;
  p = fmaf(p, f, 5.5917863e-2f);
  p = fmaf(p, f, 2.4024743e-1f);
  p = fmaf(p, f, 6.9312179e-1f);
  p = fmaf(p, f, 9.9999928e-1f);
  return __int_as_float(__float_as_int(r) * (1 << 23) + __float_as_int(p));
}

// The online-softmax rescale alpha = 2^d, d = M_old - M_new <= 0, on the FMA pipe (the speed path's
// loop keeps zero MUFU.EX2). The running max is exact, so alpha is not a power of two. d = 0 (the max
// did not move, the common case) gives exactly 1 (the polynomial gives 1 + 1.2e-7 there, which would
// weigh early tiles up by that much per tile); d = -inf (before the first tile, O = l = 0) gives 2^-120.
__device__ __forceinline__ float exp2_rescale(float d) { return d == 0.f ? 1.f : exp2_poly(d); }

// Four floats -> four E4M3 bytes (RNE, saturating), the first in the lowest byte: two pair casts
// written straight into the halves of one register (no shift/or to join them). Shared with the
// exp2 encoding of the fidelity path.
__device__ __forceinline__ uint32_t cast_e4m3x4(float x0, float x1, float x2, float x3) {
  uint32_t packed;
  asm("{\n.reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(packed)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return packed;
}

#if VC_EXPCAST_BYTE_CODES
// Four arguments -> four E4M3 bytes, the first in the lowest byte (the byte-code variants).
__device__ __forceinline__ uint32_t expcast_pack4(float a0, float a1, float a2, float a3) {
  const uint32_t lo = __byte_perm(code_bits(a0), code_bits(a1), 0x0040);
  const uint32_t hi = __byte_perm(code_bits(a2), code_bits(a3), 0x0040);
  return __byte_perm(lo, hi, 0x5410);
}
#endif

}  // namespace vc_p
