// The speed path's P encoding (reference.p_expcast), per element, for every attention kernel.
// Torch-free; needs sm_89+ for the E4M3 conversion. No MUFU and no F2I: FFMA.SAT, FFMA, IMAD per
// element, one F2FP.E4M3 per two elements.
//
// The spec: u = x * sc - M (log2 units, M the exact running row max, any float), w = u + log2(448) + beta/8, held to 13
// fraction bits as y = fl32(x * sc + (C - M)) on [1024, 2048) (C = 1536 + log2(448) + beta/8 in
// float32) with the floor w >= -24; the float32 2^floor(w) (1 + frac(w)) (exponent bits from the
// integer part) is rounded to E4M3 by the hardware cast (451.3 at u = 0 saturates to 448, never NaN).
// The kernels compute it on the FMA pipes (the ALU pipe, 16 lanes per scheduler, was the busiest pipe
// of the sm90 speed kernel in ncu with the floor as FMNMX and the shift as LEA; moving them measured
// -3% at Wan2.2-14B and -7% at head dim 64: docs/kernel-notes.md section 12):
//   z = FFMA.SAT(x, sc/64, ((C - M) - 1512)/64) = (w + 24)/64 clamped to [0, 1] - the floor for free,
//       and a masked key (z = 0) is code 0;
//   y = FFMA(z, 64, 1024) = 1024 + (w + 24) to 2^-13, the spec's fixed point shifted by the integer 488;
//   bits(y) * 2^10 + ((127 - 24) << 23) as one IMAD (y's exponent falls off the top mod 2^32).
// The row constant is the spec's float32 C - M, so z carries the spec's w; the codes differ from the
// spec's only where w is within 2^-19 of a 2^-13 rounding boundary and that also decides an E4M3
// rounding (none of 2.9M emulated scores: tests/test_expcast_kernel_form.py).
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
#include <cstdint>

#include "vc_constants.h"

#ifndef VC_EXPCAST_PAPER
#define VC_EXPCAST_PAPER 0
#endif
#ifndef VC_EXPCAST_ALU
#define VC_EXPCAST_ALU 0
#endif
#ifndef VC_EXPCAST_INT
#define VC_EXPCAST_INT 0
#endif
#ifndef VC_EXPCAST_INT_D64
#define VC_EXPCAST_INT_D64 0
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

namespace vc_p {

// the constants come from kernels/constants.py through vc_constants.h (one definition)
#if VC_EXPCAST_PAPER
constexpr float kExpCastLog2Scale = vc::kPLog2Max + vc::kExpCastBeta / 8.f;  // P ~ 2^(u + this)
#else
constexpr float kExpCastLog2Scale = vc::kExpCastPLog2Scale;  // P ~ 2^(u + this), for the LSE
#endif
// 2^kExpCastShift: what the fixed-point bits are multiplied by (see exponent_float)
constexpr uint32_t kExpCastBitsMul = 1u << vc::kExpCastShift;

#if VC_EXPCAST_ALU
// t = 8u + 8 log2(448) + 56 + beta (126.09 at u = 0) = 256 x + kAluTFloor, x = sat((t - kAluTFloor) / 256)
constexpr float kAluTOffset = 8.f * vc::kExpCastPLog2Scale + 56.f;
constexpr int kAluLines = VC_EXPCAST_ALU_LINES;
// where the flattest chord line reaches 0: 4 + t/2 at -8, 4 + t/4 at -16, 3 + t/8 at -24
constexpr float kAluTFloor = kAluLines == 1 ? -8.f : (kAluLines == 2 ? -16.f : -24.f);
constexpr float kAluMagic = 12582912.f;  // 1.5 * 2^23: float32 ulp 1, the low byte of x + magic is rint(x)
#endif

#if !VC_EXPCAST_BYTE_CODES
constexpr float kZRange = 64.f;  // z = (w + kWFloor) / kZRange in [0, 1]: w in [-24, 40]
constexpr float kWFloor = 24.f;  // w >= -24, the spec's floor: far below E4M3's smallest code 2^-9
static_assert(vc::kExpCastRowConstant - vc::kExpCastFloor > kWFloor && vc::kExpCastRowConstant - vc::kExpCastFloor < kWFloor + 9.f,
              "the spec's floor is w = -24: C - floor = 24 + log2(E4M3 max) + beta/8");
constexpr uint32_t kZExponentBias = (127u - static_cast<uint32_t>(kWFloor)) << 23;  // re-biases w + 24 to w + 127
#endif

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
#else
  // the spec's row constant rounded as the spec rounds it (C - m), then moved to the floor's origin
  // (exact) and scaled by 2^-6 (exact): z carries the spec's w, not a more precise one that would
  // round differently near E4M3 boundaries (that cost 1e-3 rel-L2 on peaky rows at head dim 64)
  return {sc * (1.f / kZRange), ((vc::kExpCastRowConstant - m) - vc::kExpCastFloor) * (1.f / kZRange)};
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
#else
// float32 2^floor(w) (1 + frac(w)) from z = (w + 24)/64: y = 1024 + 64 z holds w + 24 with 13 fraction
// bits; its bits times 2^10 drop y's exponent off the top (mod 2^32) and leave (w + 24) 2^23.
// bits_mul is 2^10 read at run time (a kernel parameter where the kernel passes one): with a constant
// multiplier ptxas emits LEA on the ALU pipe, which is the pipe this form exists to unload.
__device__ __forceinline__ float exponent_float(float z, uint32_t bits_mul) {
  const float y = fmaf(z, kZRange, 1024.f);
  return __uint_as_float(__float_as_uint(y) * bits_mul + kZExponentBias);
}
#endif

#if VC_EXPCAST_INT
// The integer form (VC_EXPCAST_INT=1; study: the same w with one IMAD per element instead of
// I2FP + FFMA.SAT + FFMA + IMAD). Per row and key block, with a0 the block's largest integer score,
// sc the row's score scale and M the running max (both float32, as now):
//   t(a) = T0 + (a - a0) A,  A = rint(min(sc 2^23, 2^28)),  T0 = rint((127 + log2(448) + beta/8 + fl(a0 sc) - M) 2^23)
// is 2^23 (w + 127) in fixed point: the float32 with those bits is the chord 2^floor(w) (1 + frac(w))
// and the hardware cast rounds it to E4M3 (t <= 0: code 0). The clamp a >= a_lo keeps t in
// [0, T0] (no wrap of the 32-bit product): a_lo = a0 - K with T0 - K A in [0, 117 2^23), where every
// float is below 2^-10 and so code 0, so the clamp changes no code; K comes from a 5%-accurate
// reciprocal (the window is +-76% wide) and one F2I per row and block.
constexpr float kExpCastTop = 127.f + vc::kExpCastPLog2Scale;
struct ExpCastIntRow {
  uint32_t mul, add;
  int lo;
};
__device__ __forceinline__ ExpCastIntRow expcast_int_row(float sc, int a0, float m) {
  // <= 0: how far this block's max is below the running max; rounded twice as the spec rounds it (no
  // FFMA contraction: fl(fl(a0 sc) - M), the product being the block max the running max took)
  const float e = __fsub_rn(__fmul_rn(static_cast<float>(a0), sc), m);
  const float a_f = fminf(sc * 8388608.f, 268435456.f);
  const int a = __float2int_rn(a_f);
  const float t0f = __fadd_rn(kExpCastTop, e) * 8388608.f;
  const int t0 = max(__float2int_rn(t0f), 0);
  const float inv_a = __uint_as_float(0x7EF311C7u - __float_as_uint(a_f));  // 1/a_f within 5%
  const int k = min(max(__float2int_rz((t0f - 58.5f * 8388608.f) * inv_a), 0), 1 << 30);
  return {static_cast<uint32_t>(a), static_cast<uint32_t>(t0) - static_cast<uint32_t>(a0) * static_cast<uint32_t>(a), a0 - k};
}
__device__ __forceinline__ float expcast_int_float(int s, const ExpCastIntRow& r) {
  return __uint_as_float(static_cast<uint32_t>(max(s, r.lo)) * r.mul + r.add);
}
#endif

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

// Four arguments -> four E4M3 bytes, the first in the lowest byte. bits_mul: kExpCastBitsMul, passed
// from a kernel parameter by kernels that want the IMAD (unused by the byte-code variants).
__device__ __forceinline__ uint32_t expcast_pack4(float a0, float a1, float a2, float a3,
                                                  uint32_t bits_mul = kExpCastBitsMul) {
#if VC_EXPCAST_BYTE_CODES
  const uint32_t lo = __byte_perm(code_bits(a0), code_bits(a1), 0x0040);
  const uint32_t hi = __byte_perm(code_bits(a2), code_bits(a3), 0x0040);
  return __byte_perm(lo, hi, 0x5410);
#else
  return cast_e4m3x4(exponent_float(a0, bits_mul), exponent_float(a1, bits_mul), exponent_float(a2, bits_mul),
                     exponent_float(a3, bits_mul));
#endif
}

}  // namespace vc_p
