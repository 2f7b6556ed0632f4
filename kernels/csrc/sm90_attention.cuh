// VC-Attention forward for Hopper (sm_90a): TMA + mbarrier pipeline, one producer warp, two
// consumer warpgroups of 64 query rows, wgmma INT8 QK^T and FP8 PV with P from registers.
// Torch-free. Numerics follow kernels/reference.py exactly (see the comments at each step).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "sm90_ptx.cuh"
#include "sm90_wgmma.cuh"

namespace vc_sm90 {

constexpr int kBlockM = 128;  // query rows per CTA: two consumer warpgroups of 64 rows
constexpr int kBlockN = 128;  // keys per KV tile = K scale block = V-Smooth block
constexpr int kThreads = 384;  // warpgroup 0: producer (one active warp); 1 and 2: consumers
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;

struct Params {
  const float* q_scale;  // (BH, n_qblocks): one scale per 64 query rows, sm_scale*log2(e) folded in
  const float* k_scale;  // (BH, n_pad/128)
  const float* v_scale;  // (BH, D): per-channel scale of the FP8 V residual
  const __half* v_mean;  // (BH, n_pad/128, D): V-Smooth block means (zeros for per-channel V)
  void* out;             // fp16/bf16, channel stride 1
  int64_t out_stride_b, out_stride_h, out_stride_n;  // in elements
  int heads, n, n_pad, n_qblocks;
};

template <int D, int STAGES>
struct SmemLayout {
  static constexpr int kQBytes = kBlockM * D;
  static constexpr int kKBytes = kBlockN * D;
  static constexpr int kVLoadBytes = D * kBlockN;         // V^T rows written by TMA
  static constexpr int kVBytes = kVLoadBytes + 8 * kBlockN;  // + 8 rows of E4M3 ones (row sums)
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kQBytes;
  static constexpr int kVOff = kKOff + STAGES * kKBytes;
  static constexpr int kMuOff = kVOff + STAGES * kVBytes;  // float [STAGES][D]: mean / v_scale
  static constexpr int kKscOff = kMuOff + STAGES * D * 4;  // float [STAGES]: K tile scale
  static constexpr int kBarOff = (kKscOff + STAGES * 4 + 7) / 8 * 8;
  static constexpr int kBytes = kBarOff + (1 + 2 * STAGES) * 8;
  static constexpr int kAlloc = kBytes + 1024;  // slack: tiles need 1024-byte (swizzle atom) alignment
  static_assert(kKBytes % 1024 == 0 && kVBytes % 1024 == 0 && kQBytes % 1024 == 0, "tile alignment");
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// 2^d for an integer-valued d <= 0 (or -inf), exactly: the online-softmax rescale factor.
__device__ __forceinline__ float exp2_of_int(float d) {
  return d < -126.f ? 0.f : __int_as_float((127 + static_cast<int>(d)) << 23);
}

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Fidelity encoding: P = E4M3(exp2(s - M + 8)), four values packed low byte first.
__device__ __forceinline__ uint32_t encode_exp2(float s0, float s1, float s2, float s3, float m) {
  const float x0 = ex2_approx((s0 - m) + 8.f), x1 = ex2_approx((s1 - m) + 8.f);
  const float x2 = ex2_approx((s2 - m) + 8.f), x3 = ex2_approx((s3 - m) + 8.f);
  uint32_t packed;
  asm("{\n.reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(packed)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return packed;
}

// ExpCast code clip[0,120](rint(8u + 119.65)), u = s - M, with no F2I and no MUFU: the float sum
// t + 1.5*2^23 rounds t to the nearest integer (ties to even) into the low mantissa bits.
__device__ __forceinline__ uint32_t expcast_bits(float s, float m) {
  const float t = fmaxf(fmaf(s - m, 8.f, 119.65f), 0.f);
  return __float_as_uint(t + 12582912.f);
}

__device__ __forceinline__ uint32_t encode_expcast(float s0, float s1, float s2, float s3, float m) {
  const uint32_t lo = __byte_perm(expcast_bits(s0, m), expcast_bits(s1, m), 0x0040);
  const uint32_t hi = __byte_perm(expcast_bits(s2, m), expcast_bits(s3, m), 0x0040);
  return __byte_perm(lo, hi, 0x5410);
}

template <typename OutT>
__device__ __forceinline__ void store_pair(OutT* dst, float a, float b);
template <>
__device__ __forceinline__ void store_pair<__half>(__half* dst, float a, float b) {
  *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(a, b);
}
template <>
__device__ __forceinline__ void store_pair<__nv_bfloat16>(__nv_bfloat16* dst, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(a, b);
}

// Key index (within a 128-key tile) of accumulator column 8*chunk + 2*t + e. The K tile is loaded
// with the keys of every 16-row group reordered (see the 5-D tensor map in sm90_launch.cu) so that
// the S accumulator fragment IS the FP8 A fragment of the PV wgmma, with V^T in plain key order.
__device__ __forceinline__ int key_of_column(int chunk, int t, int e) {
  return 16 * (chunk >> 1) + 4 * t + 2 * (chunk & 1) + e;
}

template <int D, int STAGES>
__device__ __forceinline__ void producer_loop(const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                              const CUtensorMap* tm_vt, const Params& p, uint8_t* smem,
                                              uint64_t* bar_q, uint64_t* bar_full, uint64_t* bar_empty) {
  using L = SmemLayout<D, STAGES>;
  const int lane = threadIdx.x % 32;
  const int bh = blockIdx.y;
  const int n_kv = p.n_pad / kBlockN;
  // The mean is restored as l_blk * (mu / v_scale) inside the scaled accumulator. A channel with
  // v_scale == 0 has an all-zero residual, so any non-zero stand-in (1) gives the exact result.
  float inv_vs[D / 32];
#pragma unroll
  for (int c = 0; c < D / 32; ++c) {
    const float vs = p.v_scale[static_cast<int64_t>(bh) * D + lane + 32 * c];
    inv_vs[c] = vs > 0.f ? 1.f / vs : 1.f;
  }
  if (lane == 0) {
    mbar_arrive_expect_tx(bar_q, L::kQBytes);
    tma_load_2d(smem + L::kQOff, tm_q, bar_q, 0, bh * p.n_pad + blockIdx.x * kBlockM);
  }
  float* mu_smem = reinterpret_cast<float*>(smem + L::kMuOff);
  float* ksc_smem = reinterpret_cast<float*>(smem + L::kKscOff);
  for (int j = 0; j < n_kv; ++j) {
    const int s = j % STAGES;
    mbar_wait(&bar_empty[s], ((j / STAGES) & 1) ^ 1);
    const __half* mean = p.v_mean + (static_cast<int64_t>(bh) * n_kv + j) * D;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) mu_smem[s * D + lane + 32 * c] = __half2float(mean[lane + 32 * c]) * inv_vs[c];
    if (lane == 0) ksc_smem[s] = p.k_scale[static_cast<int64_t>(bh) * n_kv + j];
    __syncwarp();
    if (lane == 0) {
      mbar_arrive_expect_tx(&bar_full[s], L::kKBytes + L::kVLoadBytes);
      tma_load_5d(smem + L::kKOff + s * L::kKBytes, tm_k, &bar_full[s], 0, 0, 0, 0,
                  (bh * p.n_pad + j * kBlockN) / 16);
      tma_load_2d(smem + L::kVOff + s * L::kVBytes, tm_vt, &bar_full[s], j * kBlockN, bh * D);
    }
  }
}

template <int D, bool EXPCAST, typename OutT, int STAGES>
__device__ __forceinline__ void consumer_loop(const Params& p, uint8_t* smem, uint64_t* bar_q, uint64_t* bar_full,
                                              uint64_t* bar_empty) {
  using L = SmemLayout<D, STAGES>;
  constexpr int kChunksO = D / 8;  // n8 chunks of the output accumulator
  const int wg = threadIdx.x / 128 - 1;
  const int tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int bh = blockIdx.y;
  const int n_kv = p.n_pad / kBlockN;
  const int q_block = blockIdx.x * 2 + wg;  // this warpgroup's 64 rows share one Q scale
  const float q_sc = q_block < p.n_qblocks ? p.q_scale[static_cast<int64_t>(bh) * p.n_qblocks + q_block] : 0.f;
  const int valid_last = p.n - (n_kv - 1) * kBlockN;  // keys in the last tile, 1..128
  const uint8_t* q_tile = smem + L::kQOff + wg * 64 * D;
  const float* mu_smem = reinterpret_cast<const float*>(smem + L::kMuOff);
  const float* ksc_smem = reinterpret_cast<const float*>(smem + L::kKscOff);

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float row_sum[2] = {0.f, 0.f};
  float row_off[2] = {neg_inf(), neg_inf()};  // integer running offset M = ceil(running max)
  int32_t s_acc[64];
  float pv[D / 2 + 4];

  mbar_wait(bar_q, 0);
  for (int j = 0; j < n_kv; ++j) {
    const int s = j % STAGES;
    mbar_wait(&bar_full[s], (j / STAGES) & 1);
    const uint8_t* k_tile = smem + L::kKOff + s * L::kKBytes;
    const uint8_t* vt_tile = smem + L::kVOff + s * L::kVBytes;

    // S = Q K^T in exact int32
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk)
      wgmma_s8_m64n128k32(s_acc, smem_desc(q_tile + kk * 32, D), smem_desc(k_tile + kk * 32, D), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();

    // scores in log2 units: float(acc) * (q_scale * k_scale), as the reference rounds them
    const float sc = q_sc * ksc_smem[s];
    float sf[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) sf[i] = static_cast<float>(s_acc[i]) * sc;
    if (j == n_kv - 1 && valid_last < kBlockN) {
#pragma unroll
      for (int c = 0; c < 16; ++c)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (key_of_column(c, t, e) >= valid_last) sf[4 * c + e] = sf[4 * c + 2 + e] = neg_inf();
    }

    // integer running offset per row (rows g and g+8 of this warp's 16)
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      mx[0] = fmaxf(mx[0], fmaxf(sf[4 * c], sf[4 * c + 1]));
      mx[1] = fmaxf(mx[1], fmaxf(sf[4 * c + 2], sf[4 * c + 3]));
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
      const float m_new = fmaxf(row_off[r], ceilf(mx[r]));
      alpha[r] = exp2_of_int(row_off[r] - m_new);
      row_off[r] = m_new;
    }

    // quantized P straight into the FP8 A fragments: register r of k-step kk holds row g (r even)
    // or g+8 (r odd) at keys 32kk + 16(r/2) + 4t + 0..3 = columns of chunks c0, c0+1 (see key_of_column)
    uint32_t pa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int c0 = 4 * kk + 2 * (r >> 1), row = r & 1;
        const float a0 = sf[4 * c0 + 2 * row], a1 = sf[4 * c0 + 2 * row + 1];
        const float a2 = sf[4 * (c0 + 1) + 2 * row], a3 = sf[4 * (c0 + 1) + 2 * row + 1];
        pa[kk][r] = EXPCAST ? encode_expcast(a0, a1, a2, a3, row_off[row]) : encode_exp2(a0, a1, a2, a3, row_off[row]);
      }

    // this tile's P V (fresh accumulator: FP8 wgmma accumulates at reduced precision, so each
    // tile's sum is added to the float32 total below); columns D..D+7 are the row sums of P
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if constexpr (D == 128)
        wgmma_e4m3_m64n136k32(pv, pa[kk], smem_desc(vt_tile + kk * 32, 128), kk > 0);
      else
        wgmma_e4m3_m64n72k32(pv, pa[kk], smem_desc(vt_tile + kk * 32, 128), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();

    // O = alpha O + (P R + l_blk mu/v_scale);  l = alpha l + l_blk
    const float l_blk[2] = {pv[4 * kChunksO], pv[4 * kChunksO + 2]};
    const float* mu = mu_smem + s * D;
#pragma unroll
    for (int i = 0; i < kChunksO; ++i) {
      const float2 m2 = *reinterpret_cast<const float2*>(mu + 8 * i + 2 * t);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        o[4 * i + 2 * r] = fmaf(o[4 * i + 2 * r], alpha[r], fmaf(l_blk[r], m2.x, pv[4 * i + 2 * r]));
        o[4 * i + 2 * r + 1] = fmaf(o[4 * i + 2 * r + 1], alpha[r], fmaf(l_blk[r], m2.y, pv[4 * i + 2 * r + 1]));
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) row_sum[r] = fmaf(row_sum[r], alpha[r], l_blk[r]);
    __syncwarp();
    if (lane == 0) mbar_arrive(&bar_empty[s]);
  }

  // out = v_scale * O / l in the caller's layout
  const int b = bh / p.heads, h = bh % p.heads;
  OutT* out = static_cast<OutT*>(p.out) + b * p.out_stride_b + h * p.out_stride_h;
  const float* vscale = p.v_scale + static_cast<int64_t>(bh) * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = blockIdx.x * kBlockM + wg * 64 + warp * 16 + g + 8 * r;
    if (row >= p.n) continue;
    const float inv_l = 1.f / row_sum[r];
    OutT* dst = out + static_cast<int64_t>(row) * p.out_stride_n;
#pragma unroll
    for (int i = 0; i < kChunksO; ++i) {
      const int col = 8 * i + 2 * t;
      const float vs0 = vscale[col] > 0.f ? vscale[col] : 1.f;
      const float vs1 = vscale[col + 1] > 0.f ? vscale[col + 1] : 1.f;
      store_pair<OutT>(dst + col, o[4 * i + 2 * r] * vs0 * inv_l, o[4 * i + 2 * r + 1] * vs1 * inv_l);
    }
  }
}

template <int D, bool EXPCAST, typename OutT, int STAGES>
__global__ void __launch_bounds__(kThreads, 1)
    vc_attention_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                             const __grid_constant__ CUtensorMap tm_vt, const Params p) {
  using L = SmemLayout<D, STAGES>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* bar_q = reinterpret_cast<uint64_t*>(smem + L::kBarOff);
  uint64_t* bar_full = bar_q + 1;
  uint64_t* bar_empty = bar_full + STAGES;

  if (threadIdx.x == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&bar_full[s], 1);
      mbar_init(&bar_empty[s], 8);  // lane 0 of each of the 8 consumer warps
    }
  }
  // E4M3 ones (0x38) in the 8 rows after V^T of every stage: written once, never overwritten by TMA
  for (int i = threadIdx.x; i < STAGES * 2 * kBlockN; i += kThreads) {
    const int s = i / (2 * kBlockN), w = i % (2 * kBlockN);
    reinterpret_cast<uint32_t*>(smem + L::kVOff + s * L::kVBytes + L::kVLoadBytes)[w] = 0x38383838u;
  }
  fence_proxy_async();
  __syncthreads();

  if (threadIdx.x < 128) {
    regs_dealloc<kProducerRegs>();
    if (threadIdx.x < 32) producer_loop<D, STAGES>(&tm_q, &tm_k, &tm_vt, p, smem, bar_q, bar_full, bar_empty);
  } else {
    regs_alloc<kConsumerRegs>();
    consumer_loop<D, EXPCAST, OutT, STAGES>(p, smem, bar_q, bar_full, bar_empty);
  }
}

}  // namespace vc_sm90
