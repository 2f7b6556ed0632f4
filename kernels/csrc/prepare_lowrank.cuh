// V-Smooth's head-global low-rank term in the fused prepare (reference.quantize_v_vsmooth with a basis):
// V = mu_block + A W + R', A = R W^T per token (R = V - mu_block), E4M3 with one scale per head and
// component, R' = R - A_q W per-channel E4M3 with the statistics pass's bound as its scale.
// The threads of a row (D/8 consecutive lanes, 8 channels each) reduce each coefficient by shuffles, so
// every lane of the row holds the same A (the butterfly adds the same pairs in every lane).
#pragma once
#include <cuda_fp8.h>

#include "common.cuh"
#include "vc_params.h"

namespace vc {

// The head's basis rows in shared memory as float32 (zeros past the rank): in registers they took ~50
// per thread and halved the kernels' occupancy. Every thread reads its 8 channels of a row as two float4.
template <int D>
struct LowRankBasis {
  const float (*w)[D];
  __device__ __forceinline__ void channels(int k, int c0, float (&out)[8]) const {
    const float4 lo = *reinterpret_cast<const float4*>(&w[k][c0]), hi = *reinterpret_cast<const float4*>(&w[k][c0 + 4]);
    out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w, out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
  }
};

// Fills rows (shared memory) and ends with a barrier.
template <int D>
__device__ __forceinline__ LowRankBasis<D> load_basis(const PrepareParams& p, int bh, float (*rows)[D]) {
  const __half* src = reinterpret_cast<const __half*>(p.v_basis) + int64_t(bh) * p.v_rank * D;
  for (int i = threadIdx.x; i < kMaxVRank * D; i += blockDim.x) rows[i / D][i % D] = i < p.v_rank * D ? __half2float(src[i]) : 0.0f;
  __syncthreads();
  return LowRankBasis<D>{rows};
}

// sum over the row's channels of x * w (each lane holds 8 of them); every lane of the row gets it. All
// lanes of the row must call it together.
template <int D>
__device__ __forceinline__ float row_dot(const float (&x)[8], const float (&w)[8]) {
  constexpr int kLanes = D / 8;
  static_assert(kLanes == 8 || kLanes == 16, "head dim 64 or 128");
  const unsigned lane = threadIdx.x & 31u;
  const unsigned mask = ((1u << kLanes) - 1u) << (lane & (32u - kLanes));
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = fmaf(x[i], w[i], s);
#pragma unroll
  for (int o = kLanes / 2; o > 0; o /= 2) s += __shfl_xor_sync(mask, s, o);
  return s;
}

// The coefficients A = R W^T of a residual row (zeros past the rank).
template <int D>
__device__ __forceinline__ void row_coefficients(const float (&r)[8], const LowRankBasis<D>& b, int rank, int c0,
                                                 float (&a)[kMaxVRank]) {
#pragma unroll
  for (int k = 0; k < kMaxVRank; ++k) {
    float w[8];
    if (k < rank) b.channels(k, c0, w);
    a[k] = k < rank ? row_dot<D>(r, w) : 0.0f;
  }
}

// r - sum_k a_k W_k on this thread's channels (the sum first, as reference's (A W) then R - A W).
template <int D>
__device__ __forceinline__ void subtract_low_rank(float (&r)[8], const float (&a)[kMaxVRank], const LowRankBasis<D>& b,
                                                  int rank, int c0) {
  float s[8] = {};
#pragma unroll
  for (int k = 0; k < kMaxVRank; ++k) {
    if (k < rank) {
      float w[8];
      b.channels(k, c0, w);
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i] = fmaf(a[k], w[i], s[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) r[i] -= s[i];
}

// Statistics pass, one residual row: the per-channel amax of R - A W into vacc, |A_k| into camax.
template <int D>
__device__ __forceinline__ void low_rank_stats_row(float (&r)[8], const LowRankBasis<D>& b, int rank, int c0,
                                                   float (&vacc)[8], float (&camax)[kMaxVRank]) {
  float a[kMaxVRank];
  row_coefficients<D>(r, b, rank, c0, a);
#pragma unroll
  for (int k = 0; k < kMaxVRank; ++k) camax[k] = fmaxf(camax[k], fabsf(a[k]));
  subtract_low_rank<D>(r, a, b, rank, c0);
#pragma unroll
  for (int i = 0; i < 8; ++i) vacc[i] = fmaxf(vacc[i], fabsf(r[i]));
}

// The head's coefficient amax (non-negative floats order like their bits: an integer max is a float max).
__device__ __forceinline__ void low_rank_stats_amax(const PrepareParams& p, int bh, float (&camax)[kMaxVRank]) {
#pragma unroll
  for (int k = 0; k < kMaxVRank; ++k) {
    const float m = warp_max(camax[k]);
    if ((threadIdx.x & 31) == 0 && k < p.v_rank) atomicMax(reinterpret_cast<int*>(p.c_amax) + int64_t(bh) * kMaxVRank + k, __float_as_int(m));
  }
}

// The quantize pass's per-head parameters of the term: the coefficient scales (written by block 0) and
// the residual's per-channel bound: amax|R - A W| (statistics pass) + 2^-4 sum_k amax|A_k| |W_kd|.
struct LowRankCodes {
  float inv[kMaxVRank];    // E4M3 max / amax|A_k| (0 for an all-zero component)
  float scale[kMaxVRank];  // amax|A_k| / E4M3 max
};

template <int D>
__device__ __forceinline__ LowRankCodes low_rank_code_params(const PrepareParams& p, int bh) {
  LowRankCodes c;
#pragma unroll
  for (int k = 0; k < kMaxVRank; ++k) {
    const float amax = k < p.v_rank ? p.c_amax[int64_t(bh) * kMaxVRank + k] : 0.0f;
    c.inv[k] = amax > 0.0f ? (1.0f / amax) * kE4m3Max : 0.0f;  // torch's `limit / t` is reciprocal(t) * limit
    c.scale[k] = amax / kE4m3Max;
  }
  if (blockIdx.x == 0 && threadIdx.x < p.v_rank) p.v_low_scale[int64_t(bh) * p.v_rank + threadIdx.x] = c.scale[threadIdx.x];
  return c;
}

// The residual scale's bound for channel c (see above), from the statistics pass's amax of R - A W.
template <int D>
__device__ __forceinline__ float low_rank_residual_bound(const PrepareParams& p, int bh, int c, float amax_r) {
  float s = 0.0f;
  for (int k = 0; k < p.v_rank; ++k) {
    const float w = __half2float(reinterpret_cast<const __half*>(p.v_basis)[(int64_t(bh) * p.v_rank + k) * D + c]);
    s = fmaf(p.c_amax[int64_t(bh) * kMaxVRank + k], fabsf(w), s);
  }
  return amax_r + 0.0625f * s;
}

__device__ __forceinline__ float decode_e4m3(uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3)));
}

// Quantize pass, one residual row: the coefficient codes (codes[k], zero past the rank) and r -> R - A_q W.
template <int D>
__device__ __forceinline__ void low_rank_quantize_row(float (&r)[8], const LowRankBasis<D>& b, const LowRankCodes& c, int rank,
                                                      int c0, uint8_t (&codes)[kMaxVRank]) {
  float a[kMaxVRank];
  row_coefficients<D>(r, b, rank, c0, a);
#pragma unroll
  for (int k = 0; k < kMaxVRank; ++k) {
    codes[k] = k < rank ? uint8_t(e4m3x2(a[k] * c.inv[k], 0.0f) & 0xFF) : 0;
    a[k] = decode_e4m3(codes[k]) * c.scale[k];  // A_q as reference: code value * scale in float32
  }
  subtract_low_rank<D>(r, a, b, rank, c0);
}

}  // namespace vc
