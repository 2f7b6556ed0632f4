// The fused preprocessing of prepare.cuh with every row a thread handles loaded once, all loads of a
// block issued before any is used (VC_PREP_ROWS_IN_REGS=1, a build-time variant of the prepare
// extension: kernels/prepare_cuda.py).
//
// Why: prepare.cuh's loops load one row per iteration and use it at once (stats: the slot's perm
// index, then its K and V slices; quantize: K twice, around the block max), so a thread has one
// 16-byte load in flight behind a dependent index load. Here a thread first reads the perm indices of
// all its rows (8 at D=128, 4 at D=64), then issues all their Q, K and V loads (raw, 16 bytes each),
// and converts from registers: one round trip per kind instead of one per row, and K and V are read
// once per kernel (stats read V twice, quantize K twice, from L1/L2).
//
// Same arithmetic in the same order as prepare.cuh (row sums accumulate rows in increasing slot
// order; the same conversions, scales and casts), so every output is bit-identical
// (tests/test_prepare_variants_gpu.py).
#pragma once
#include "prepare_staged.cuh"  // the row staging helpers and the statistics body (stats_from_staged_rows)

namespace vc {

template <typename T, int D>
__global__ __launch_bounds__(kPrepThreads) void prepare_stats_regs_kernel(const PrepareParams p) {
  stats_from_staged_rows<T, D, true>(p);  // prepare_staged.cuh: K's and V's loads all issued first
}

template <typename T, int D, bool kQkFp8>
__global__ __launch_bounds__(kPrepThreads) void prepare_quantize_regs_kernel(const PrepareParams p) {
  constexpr int kLanesPerRow = D / 8;
  constexpr int kRowsPerPass = kPrepThreads / kLanesPerRow;
  constexpr int kRows = kPrepRowsPerThread<D>;
  static_assert(32 % kLanesPerRow == 0, "a row's threads must sit in one warp");
  __shared__ float scratch[32];
  __shared__ __align__(16) uint8_t v_tile[D][kKBlock + 16];  // transposed codes; rows stay 16-byte aligned

  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int row0 = blockIdx.x * kKBlock;
  const int valid = min(kKBlock, p.n - row0);
  const int c0 = (threadIdx.x % kLanesPerRow) * 8, row_sub = threadIdx.x / kLanesPerRow;
  const int64_t bh_rows = int64_t(bh) * p.n_pad;
  const float limit = kQkFp8 ? kE4m3Max : kInt8Max;

  // every load of the block first: Q in token order, K and V gathered in the permuted order
  int q_tok[kRows], kv_tok[kRows];
  block_tokens<D>(p, bh, row0, valid, row_sub, false, q_tok);
  block_tokens<D>(p, bh, row0, valid, row_sub, true, kv_tok);
  uint4 q_raw[kRows], k_raw[kRows], v_raw[kRows];
  load_rows_raw<T, D>(p.q, p.q_stride, b, h, q_tok, c0, q_raw);
  load_rows_raw<T, D>(p.k, p.k_stride, b, h, kv_tok, c0, k_raw);
  load_rows_raw<T, D>(p.v, p.v_stride, b, h, kv_tok, c0, v_raw);

  // Q: one scale per row (quantize_rows), scores pre-scaled into log2 units; padded rows: zeros
  {
    uint8_t* dst = static_cast<uint8_t*>(p.q_q) + (bh_rows + row0 + row_sub) * D;
    float* scale_dst = p.q_scale + bh_rows + row0 + row_sub;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      float x[8] = {};
      if (q_tok[i] >= 0) {
        unpack8_as_float<T>(q_raw[i], x);
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] *= p.qk_scale;
      }
      quantize_row_slice<D, kQkFp8>(x, dst + int64_t(i) * kRowsPerPass * D + c0, scale_dst + i * kRowsPerPass, c0);
    }
  }

  // K: smoothed by the mean over all tokens, one scale per block (quantize_row_block)
  {
    float k_mean[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) k_mean[e] = p.smooth_k ? p.k_sum[int64_t(bh) * D + c0 + e] / float(p.n) : 0.0f;
    // the smoothed slice of row i, converted from the registers in both passes (as cheap as keeping
    // the 8 kRows floats, which would cost 64 registers at D=128)
    auto smoothed = [&](int i, float (&x)[8]) {
      unpack8_as_float<T>(k_raw[i], x);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] -= k_mean[e];
    };
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      if (kv_tok[i] < 0) continue;
      float x[8];
      smoothed(i, x);
#pragma unroll
      for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(x[e]));
    }
    amax = block_max(amax, scratch);
    const float inv = amax > 0.0f ? (1.0f / amax) * limit : 0.0f;
    uint8_t* dst = static_cast<uint8_t*>(p.k_q) + (bh_rows + row0) * D;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = row_sub + i * kRowsPerPass;
      uint2 codes = make_uint2(0u, 0u);
      if (kv_tok[i] >= 0) {
        float x[8];
        smoothed(i, x);
        codes = codes8<kQkFp8>(x, inv);
      }
      *reinterpret_cast<uint2*>(dst + int64_t(r) * D + c0) = codes;
    }
    if (threadIdx.x == 0) p.k_scale[int64_t(bh) * gridDim.x + blockIdx.x] = amax / limit;
  }

  // V: residual against the fp16 block mean (V-Smooth) or V itself, per-channel E4M3, transposed
  float v_mean[8], v_inv[8];
  v_code_params<D>(p, bh, c0, v_mean, v_inv);
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = row_sub + i * kRowsPerPass;
    float x[8];
    unpack8_as_float<T>(v_raw[i], x);
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const uint16_t two = kv_tok[i] >= 0 ? e4m3x2((x[e] - v_mean[e]) * v_inv[e], (x[e + 1] - v_mean[e + 1]) * v_inv[e + 1]) : 0;
      v_tile[c0 + e][r] = uint8_t(two & 0xFF);
      v_tile[c0 + e + 1][r] = uint8_t(two >> 8);
    }
  }
  __syncthreads();
  store_v_tile<D>(p, bh, row0, v_tile);
}

}  // namespace vc
