// Device helpers shared by the VC-Attention kernels: 16-bit input loads, E4M3 casts, exact
// float<->int tricks, and thin wrappers around the PTX we use (cp.async, ldmatrix, mma.sync).
// Torch-free; needs sm_89+ for the FP8 instructions.
#pragma once
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "vc_constants.h"

namespace vc {

constexpr float kLn2 = 0.6931471805599453f;
// Adding 1.5*2^23 to a float in [-2^22, 2^22] leaves round-to-nearest-even(x) in the low mantissa
// bits: rint without F2I (which runs on the slow MUFU-class pipe), and the exact inverse for ints.
constexpr float kRoundMagic = 12582912.0f;
constexpr int kRoundMagicBits = 0x4B400000;

// ---------------------------------------------------------------------------------------------
// 16-bit inputs: 8 consecutive elements (one 16-byte load) to float
template <typename T>
__device__ __forceinline__ void unpack8_as_float(const uint4& raw, float (&out)[8]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(&words[i]);
      out[2 * i] = __low2float(pair);
      out[2 * i + 1] = __high2float(pair);
    } else {
      const __half2 pair = *reinterpret_cast<const __half2*>(&words[i]);
      out[2 * i] = __low2float(pair);
      out[2 * i + 1] = __high2float(pair);
    }
  }
}
template <typename T>
__device__ __forceinline__ void load8_as_float(const T* src, float (&out)[8]) {
  unpack8_as_float<T>(*reinterpret_cast<const uint4*>(src), out);
}

// fp16 output saturates at 65504, as reference.to_output_dtype: dequantized V can exceed the input's
// range by an FP8 rounding, and a plain cast gave inf where SDPA gives none. |NaN| > 65504 is false,
// so NaN stays NaN.
__device__ __forceinline__ float saturate_fp16(float x) { return fabsf(x) > 65504.f ? copysignf(65504.f, x) : x; }

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// ---------------------------------------------------------------------------------------------
// quantizers (bit-exact with reference.py)

// Two floats -> two E4M3 bytes (RNE, saturating to +-448): `lo` in bits 0-7, `hi` in bits 8-15.
__device__ __forceinline__ uint16_t e4m3x2(float lo, float hi) {
  uint16_t out;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
  return out;
}

__device__ __forceinline__ uint32_t e4m3x4(float a0, float a1, float a2, float a3) {
  return uint32_t(e4m3x2(a0, a1)) | (uint32_t(e4m3x2(a2, a3)) << 16);
}

// clamp(rint(x), -127, 127) as a byte
__device__ __forceinline__ uint32_t int8_code(float x) {
  const int r = max(-127, min(127, __float2int_rn(x)));
  return uint32_t(r) & 0xFFu;
}

#ifndef VC_MMA_I2FP
#define VC_MMA_I2FP 0  // 1 (variant): one I2FP.F32.S32 (sm_89+: ALU pipe) instead of the two-instruction form
#endif
// Exact int32 -> float for |v| < 2^22 without I2F: the magic constant's mantissa holds v (IADD3 + FADD).
// VC_MMA_I2FP: the conversion instruction itself, which on sm_89+ is I2FP on the ALU pipe, not the old
// MUFU-class I2F (the Hopper kernel converts with it; kernel-notes section 18).
__device__ __forceinline__ float small_int_to_float(int v) {
#if VC_MMA_I2FP
  return __int2float_rn(v);
#else
  return __int_as_float(v + kRoundMagicBits) - kRoundMagic;
#endif
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------------------------------------
// PTX wrappers
__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A(16x32 s8, row) * B(32x8 s8, col) + C, int32 accumulate
__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// VC_MMA_E4M3_VIA_F16=1: mma_e4m3 as two m16n8k16 f16 MMAs on unpacked operands, the fp32 accumulator
// chained through both. sm_90a and sm_100a have no FP8 mma.sync: ptxas lowers each one to the same
// unpacks and two HMMA.16816.F32, but starts the HMMAs from zero and adds the incoming C with four FADD
// (docs/kernel-notes.md sec. 16: ~270 of the ~1400 instructions of a wide D=128 chunk at sm_90a).
// Every E4M3 value is exact in fp16, so only the accumulation's rounding differs (the tensor core's
// fp32 accumulate instead of one IEEE add per MMA). On sm_89 / sm_120a (native QMMA) it is slower.
#ifndef VC_MMA_E4M3_VIA_F16
#define VC_MMA_E4M3_VIA_F16 0
#endif

// The two bytes pairs of an e4m3x4 register as two f16x2: lo = bytes 0,1 (byte 0 in the low half), hi = bytes 2,3.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t x, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(x));
}

// D = A(16x16 f16, row) * B(16x8 f16, col) + C, float accumulate
__device__ __forceinline__ void mma_f16_k16_f32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Non-negative E4M3 codes (bytes below 0x80) as f16 without a conversion: the f16 whose bits are code << 7 is the
// code's value times 2^-8 exactly (exponent field e -> 2^(e - 15) instead of 2^(e - 7); a subnormal code's mantissa
// lands in the f16 subnormal range, m 2^-6 / 8 -> m 2^-14 / 8). Two shifts and two masks for four codes, the bytes
// paired (0, 2) and (1, 3): even = codes 0 and 2, odd = codes 1 and 3
__device__ __forceinline__ void e4m3x4_to_f16x2x2_scaled(uint32_t x, uint32_t& even, uint32_t& odd) {
  even = (x << 7) & 0x3F803F80u;
  odd = (x >> 1) & 0x3F803F80u;
}

// mma_e4m3 through f16 with B given in f16 already (VC_MMA_V_F16): b[0] / b[1] are the f16x2 of the k-slots 2t, 2t + 1
// / 2t + 8, 2t + 9 of the first 16 keys, b[2] / b[3] of the next 16, in the slot order of A's unpack: e4m3x4_to_f16x2x2
// puts keys 4t, 4t + 1 / 4t + 2, 4t + 3 there (mma_e4m3's own two HMMAs), kScaledA (VC_MMA_P_ALU_UNPACK) the keys
// 4t, 4t + 2 / 4t + 1, 4t + 3 at 2^-8 times their value (e4m3x4_to_f16x2x2_scaled: A must be non-negative, as P is)
template <bool kScaledA = false>
__device__ __forceinline__ void mma_e4m3_f16b(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  uint32_t a_lo[4], a_hi[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kScaledA) {
      e4m3x4_to_f16x2x2_scaled(a[i], a_lo[i], a_hi[i]);
    } else {
      e4m3x4_to_f16x2x2(a[i], a_lo[i], a_hi[i]);
    }
  }
  mma_f16_k16_f32(d, a_lo[0], a_lo[1], a_hi[0], a_hi[1], b[0], b[1]);  // keys 0..15
  mma_f16_k16_f32(d, a_lo[2], a_lo[3], a_hi[2], a_hi[3], b[2], b[3]);  // keys 16..31
}

// D = A(16x32 e4m3, row) * B(32x8 e4m3, col) + C, float accumulate
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (VC_MMA_E4M3_VIA_F16) {
    // The 8-bit fragment gives thread t the keys 4t..4t+3 (+16 in a[2], a[3], b1); the f16 one the
    // slots 2t, 2t+1 (registers 0, 1) and 2t+8, 2t+9 (2, 3). Keys 4t, 4t+1 go to the first slot pair and
    // 4t+2, 4t+3 to the second, in A and B alike: every key meets its own B row, so the sum is the same.
    uint32_t b[4];
    e4m3x4_to_f16x2x2(b0, b[0], b[1]);
    e4m3x4_to_f16x2x2(b1, b[2], b[3]);
    mma_e4m3_f16b(d, a, b);
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// D = A(16x32 e4m3, row) * B(32x8 e4m3, col) + C, fp16 accumulate (PTX: sm_89+). d[0] holds row g,
// columns 2t and 2t+1 as a half2, d[1] row g+8: the fp32 accumulator's layout at half the registers.
// No overflow check: the caller bounds sum |A*B| + |C| below 65504 (attn_mma_wide.cuh, VC_MMA_PV_F16).
__device__ __forceinline__ void mma_e4m3_f16(uint32_t (&d)[2], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f16.e4m3.e4m3.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};\n"
      : "+r"(d[0]), "+r"(d[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A(16x8 f16, row) * B(8x8 f16, col) + C, float accumulate. a[0]: row g, columns 2t, 2t+1 as a
// half2, a[1]: row g+8 (the layout of mma_e4m3_f16's accumulator); b: B rows 2t, 2t+1 of column g.
__device__ __forceinline__ void mma_f16_k8_f32(float (&d)[4], const uint32_t (&a)[2], uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b));
}

// D = A(16x8 tf32, row) * B(8x8 tf32, col) + C, float accumulate. a[0]: (row g, column t), a[1]: (g + 8, t),
// a[2]: (g, t + 4), a[3]: (g + 8, t + 4); b0: (row t, column g), b1: (t + 4, g); C / D as every m16n8 accumulator.
// The operands are fp32 bit patterns of which the tensor core reads the top 19 bits (sign, exponent, 10 mantissa bits)
__device__ __forceinline__ void mma_tf32_k8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// x = hi + lo with hi exact in tf32 (x's top 19 bits) and lo = x - hi exact in fp32: a product of two such splits taken
// as hi*hi + hi*lo + lo*hi on the tensor core is x*y to ~2^-20 relative (the lo*lo term and lo's own tf32 truncation
// dropped), where one tf32 product keeps ~2^-10
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = __float_as_uint(x) & 0xFFFFE000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}

// ---------------------------------------------------------------------------------------------
// block-wide reductions (blockDim.x a multiple of 32, at most 1024)
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Max over the block; `scratch` holds at least blockDim.x/32 floats. Ends with a barrier.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  v = warp_max(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < int(blockDim.x >> 5) ? scratch[lane] : 0.0f;
  r = warp_max(r);
  return r;
}

}  // namespace vc
