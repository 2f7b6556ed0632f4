// The passes of the fused prepare with each tensor's rows staged in registers, one tensor at a time.
// The quantize pass is the default build's (prepare.cuh's prepare_quantize_kernel stays as the variant
// VC_PREP_LEGACY_QUANTIZE=1 for side-by-side timing, and keeps the low-rank V term); the statistics
// pass is the variant VC_PREP_STAGED_STATS=1 (measured slower, see below).
//
// Why (ncu on the H200, Wan2.1-1.3B, docs/kernel-notes.md section 22): the legacy kernel took 233 of the
// prepare's 330 us at 32% of DRAM bandwidth. Two causes:
// - each loop loaded one row, used it and stored codes before the next load (a store may alias the
//   next load, so nothing is hoisted): one 16-byte load in flight per thread, eight round trips per
//   tensor and block, K loaded twice (block amax, then codes);
// - the V^T transpose wrote single bytes into shared memory, the 16 lanes of a row 8 channels apart,
//   i.e. 1152 bytes apart: one bank, 16-way conflicts on 1,024 byte stores per thread block.
// Here Q, K and V each issue all of a thread's row loads (8 at D=128, 4 at D=64; 32 registers of raw
// 16-bit data) before using any, K's codes come from the same registers as its amax, and the V codes
// of four consecutive tokens are packed per channel (a 4 x 4 byte transpose in registers) and stored
// as 32-bit words into the swizzled tile (v_tile_swizzle: conflict-free). The rows-in-regs variant
// (prepare_regs.cuh) staged all three tensors at once, 128 registers and two blocks per SM: slower.
//
// The statistics pass the same way (variant): K's rows are issued at once and summed, then V's, whose
// registers serve both the block mean and the residual's amax (prepare.cuh's pass loads V twice). On the
// H200 it ran 110 us against 94 at Wan2.1-1.3B (678 vs 604 at Wan2.2-14B): 74 registers against 46 (three
// blocks per SM instead of five), and that pass has no stores between its loads to begin with.
//
// Same arithmetic in the same order as the legacy kernels: every output is bit-identical
// (tests/test_prepare_variants_gpu.py compares the builds).
#pragma once
#include "prepare.cuh"

namespace vc {

template <int D>
constexpr int kPrepRowsPerThread = kKBlock / (kPrepThreads / (D / 8));  // 8 at D=128, 4 at D=64

// This thread's 16-byte slices (channels c0..c0+7) of rows tok[i] (-1: no row, zeros), all loads issued
// before any result is used.
template <typename T, int D>
__device__ __forceinline__ void load_rows_raw(const void* base, const int64_t (&stride)[3], int b, int h,
                                              const int (&tok)[kPrepRowsPerThread<D>], int c0,
                                              uint4 (&raw)[kPrepRowsPerThread<D>]) {
#pragma unroll
  for (int i = 0; i < kPrepRowsPerThread<D>; ++i)
    raw[i] = tok[i] >= 0 ? *reinterpret_cast<const uint4*>(row_ptr<T>(base, stride, b, h, tok[i]) + c0) : make_uint4(0u, 0u, 0u, 0u);
}

// The source tokens of this thread's rows of the block, -1 past `valid`. Row of tok[i]: row_sub + i
// kRowsPerPass; with `four_consecutive` (the staged kernel's V) 4 (row_sub + (i / 4) kRowsPerPass) + i % 4,
// four consecutive tokens per group, so that one 32-bit word of the transposed tile holds a channel's four
// codes.
template <int D>
__device__ __forceinline__ void block_tokens(const PrepareParams& p, int bh, int row0, int valid, int row_sub, bool permuted,
                                             int (&tok)[kPrepRowsPerThread<D>], bool four_consecutive = false) {
  constexpr int kRowsPerPass = kPrepThreads / (D / 8);
#pragma unroll
  for (int i = 0; i < kPrepRowsPerThread<D>; ++i) {
    const int r = four_consecutive ? 4 * (row_sub + (i / 4) * kRowsPerPass) + i % 4 : row_sub + i * kRowsPerPass;
    // with K scales per lane the quantize pass's V follows the lane order of K (k_order: position -> source row)
    const int src = permuted && p.k_order ? int(p.k_order[int64_t(bh) * p.n_pad + row0 + r]) : r;
    tok[i] = r < valid ? int(permuted ? source_token(p, bh, row0 + src) : int64_t(row0 + r)) : -1;
  }
}

// Four rows' codes of four channels (a[j]: row j, channel k in byte k) -> four words (w[k]: channel k,
// row j in byte j).
__device__ __forceinline__ void transpose_bytes4x4(const uint32_t (&a)[4], uint32_t (&w)[4]) {
  const uint32_t t0 = __byte_perm(a[0], a[1], 0x5140), t1 = __byte_perm(a[2], a[3], 0x5140);  // channels 0, 1
  const uint32_t t2 = __byte_perm(a[0], a[1], 0x7362), t3 = __byte_perm(a[2], a[3], 0x7362);  // channels 2, 3
  w[0] = __byte_perm(t0, t1, 0x5410);
  w[1] = __byte_perm(t0, t1, 0x7632);
  w[2] = __byte_perm(t2, t3, 0x5410);
  w[3] = __byte_perm(t2, t3, 0x7632);
}

// The statistics pass from staged rows (the body of prepare_stats_staged_kernel and of the rows-in-regs
// variant's prepare_stats_regs_kernel): K's and V's rows of the thread loaded raw, V's registers serving
// both the block mean and the residual's amax. kKvAtOnce: both tensors' loads issued before either is
// used (rows-in-regs); else K's, summed, then V's. Rows in increasing slot order, as prepare_stats_kernel's
// loop adds them (rows past `valid`: skipped), so the sums have the same bits.
template <typename T, int D, bool kKvAtOnce>
__device__ __forceinline__ void stats_from_staged_rows(const PrepareParams& p) {
  constexpr int kLanesPerRow = D / 8;
  constexpr int kRowsPerPass = kPrepThreads / kLanesPerRow;
  constexpr int kRows = kPrepRowsPerThread<D>;
  __shared__ float partial[kRowsPerPass][D];
  __shared__ float block_mean[D];

  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int row0 = blockIdx.x * kKBlock;
  const int valid = min(kKBlock, p.n - row0);
  const int c0 = (threadIdx.x % kLanesPerRow) * 8, row_sub = threadIdx.x / kLanesPerRow;
  int tok[kRows];
  block_tokens<D>(p, bh, row0, valid, row_sub, true, tok);
  uint4 k_raw[kRows], v_raw[kRows];
  if (p.smooth_k) load_rows_raw<T, D>(p.k, p.k_stride, b, h, tok, c0, k_raw);
  if constexpr (kKvAtOnce) load_rows_raw<T, D>(p.v, p.v_stride, b, h, tok, c0, v_raw);

  float ksum[8] = {}, vacc[8] = {};
  if (p.smooth_k) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      if (tok[i] < 0) continue;
      float x[8];
      unpack8_as_float<T>(k_raw[i], x);
#pragma unroll
      for (int e = 0; e < 8; ++e) ksum[e] += x[e];
    }
  }
  if constexpr (!kKvAtOnce) load_rows_raw<T, D>(p.v, p.v_stride, b, h, tok, c0, v_raw);
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    if (tok[i] < 0) continue;
    float x[8];
    unpack8_as_float<T>(v_raw[i], x);
#pragma unroll
    for (int e = 0; e < 8; ++e) vacc[e] = p.vsmooth ? vacc[e] + x[e] : fmaxf(vacc[e], fabsf(x[e]));
  }
  stats_block_sums<D>(p, bh, valid, ksum, vacc, partial, block_mean, row_sub, c0);
  if (p.vsmooth) {
#pragma unroll
    for (int e = 0; e < 8; ++e) vacc[e] = 0.0f;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      if (tok[i] < 0) continue;
      float x[8];
      unpack8_as_float<T>(v_raw[i], x);  // the residual's amax from the registers, not a second load
#pragma unroll
      for (int e = 0; e < 8; ++e) vacc[e] = fmaxf(vacc[e], fabsf(x[e] - block_mean[c0 + e]));
    }
  }
  stats_block_amax<D>(p, bh, vacc, partial, row_sub, c0);
}

template <typename T, int D>
__global__ __launch_bounds__(kPrepThreads) void prepare_stats_staged_kernel(const PrepareParams p) {
  stats_from_staged_rows<T, D, false>(p);
}

// kVLo: the instantiation for p.v_lo_channels > 0, which also writes the V residual's second term (prepare_v_lo.cuh)
// of the chosen channels into v_lo_t.
template <typename T, int D, bool kQkFp8, bool kVLo = false>
__global__ __launch_bounds__(kPrepThreads) void prepare_quantize_staged_kernel(const PrepareParams p) {
  constexpr int kLanesPerRow = D / 8;
  constexpr int kRowsPerPass = kPrepThreads / kLanesPerRow;
  constexpr int kRows = kPrepRowsPerThread<D>;
  static_assert(32 % kLanesPerRow == 0, "a row's threads must sit in one warp");
  static_assert(kRows % 4 == 0, "V is packed four tokens per word");
  __shared__ float scratch[32];
  __shared__ __align__(16) uint8_t v_tile[D][kKBlock + 16];  // transposed codes, v_tile_swizzle order

  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int row0 = blockIdx.x * kKBlock;
  const int valid = min(kKBlock, p.n - row0);
  const int c0 = (threadIdx.x % kLanesPerRow) * 8, row_sub = threadIdx.x / kLanesPerRow;
  const int64_t bh_rows = int64_t(bh) * p.n_pad;
  const float limit = kQkFp8 ? kE4m3Max : kInt8Max;
  int tok[kRows];
  uint4 raw[kRows];

  // Q: one scale per row (quantize_row_slice), token order, scores pre-scaled into log2 units
  block_tokens<D>(p, bh, row0, valid, row_sub, false, tok);
  load_rows_raw<T, D>(p.q, p.q_stride, b, h, tok, c0, raw);
  {
    uint8_t* dst = static_cast<uint8_t*>(p.q_q) + (bh_rows + row0 + row_sub) * D;
    float* scale_dst = p.q_scale + bh_rows + row0 + row_sub;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      float x[8] = {};
      if (tok[i] >= 0) {
        unpack8_as_float<T>(raw[i], x);
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] *= p.qk_scale;
      }
      quantize_row_slice<D, kQkFp8>(x, dst + int64_t(i) * kRowsPerPass * D + c0, scale_dst + i * kRowsPerPass, c0);
    }
  }

  // K: smoothed by the mean over all tokens, gathered in permuted order, one scale per block; the
  // codes from the same registers as the amax. With K scales per lane the K lanes kernel wrote them already.
  if (!p.k_lanes) {
    block_tokens<D>(p, bh, row0, valid, row_sub, true, tok);
    load_rows_raw<T, D>(p.k, p.k_stride, b, h, tok, c0, raw);
    float k_mean[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) k_mean[e] = p.smooth_k ? p.k_sum[int64_t(bh) * D + c0 + e] / float(p.n) : 0.0f;
    auto smoothed = [&](int i, float (&x)[8]) {
      unpack8_as_float<T>(raw[i], x);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] -= k_mean[e];
    };
    float amax = 0.0f;
    if (p.k_pair) {  // one scale per 256 keys: the pair's amax from the statistics pass's extremes
      amax = k_pair_amax<D>(p, bh, c0, k_mean);
    } else {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        if (tok[i] < 0) continue;
        float x[8];
        smoothed(i, x);
#pragma unroll
        for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(x[e]));
      }
    }
    amax = block_max(amax, scratch);
    const float inv = amax > 0.0f ? (1.0f / amax) * limit : 0.0f;  // as quantize_row_block
    uint8_t* dst = static_cast<uint8_t*>(p.k_q) + (bh_rows + row0) * D;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      uint2 codes = make_uint2(0u, 0u);
      if (tok[i] >= 0) {
        float x[8];
        smoothed(i, x);
        codes = codes8<kQkFp8>(x, inv);
      }
      *reinterpret_cast<uint2*>(dst + int64_t(row_sub + i * kRowsPerPass) * D + c0) = codes;
    }
    if (threadIdx.x == 0) p.k_scale[int64_t(bh) * gridDim.x + blockIdx.x] = amax / limit;
  }

  // V: residual against the fp16 block mean (V-Smooth) or V itself, per-channel E4M3, transposed
  block_tokens<D>(p, bh, row0, valid, row_sub, true, tok, /*four_consecutive=*/true);
  load_rows_raw<T, D>(p.v, p.v_stride, b, h, tok, c0, raw);
  float v_mean[8], v_inv[8];
  v_code_params<D>(p, bh, c0, v_mean, v_inv);
  const int swizzle = v_tile_swizzle<D>(c0);
  // kVLo: the second term's rows of the block, channel-major as v_tile. Not swizzled: only the lanes of chosen
  // channels store (a few per warp), so its bank conflicts cost little.
  __shared__ __align__(16) uint8_t lo_tile[kVLo ? kMaxVLoChannels : 1][kKBlock + 16];
  VLoLanes lanes{0u, 0};
  if constexpr (kVLo) lanes = v_lo_lanes(p, bh, c0);
#pragma unroll
  for (int g = 0; g < kRows / 4; ++g) {
    uint32_t lo[4], hi[4];  // row j's codes of channels c0..c0+3 and c0+4..c0+7
    uint32_t second_lo[4], second_hi[4];  // kVLo: the same of the second term
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo[j] = hi[j] = 0u;  // rows past `valid`: code 0
      second_lo[j] = second_hi[j] = 0u;
      if (tok[4 * g + j] >= 0) {
        float x[8];
        unpack8_as_float<T>(raw[4 * g + j], x);
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = (x[e] - v_mean[e]) * v_inv[e];
        lo[j] = e4m3x4(x[0], x[1], x[2], x[3]);
        hi[j] = e4m3x4(x[4], x[5], x[6], x[7]);
        if constexpr (kVLo) {
          const uint2 second = v_lo_codes8(x, lo[j], hi[j]);
          second_lo[j] = second.x;
          second_hi[j] = second.y;
        }
      }
    }
    uint32_t words[8];
    transpose_bytes4x4(lo, *reinterpret_cast<uint32_t(*)[4]>(&words[0]));
    transpose_bytes4x4(hi, *reinterpret_cast<uint32_t(*)[4]>(&words[4]));
    const int w = (row_sub + g * kRowsPerPass) ^ swizzle;  // the tokens' word in each channel's row
#pragma unroll
    for (int e = 0; e < 8; ++e) *reinterpret_cast<uint32_t*>(&v_tile[c0 + e][4 * w]) = words[e];
    if constexpr (kVLo) {
      transpose_bytes4x4(second_lo, *reinterpret_cast<uint32_t(*)[4]>(&words[0]));
      transpose_bytes4x4(second_hi, *reinterpret_cast<uint32_t(*)[4]>(&words[4]));
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (lanes.bits >> e & 1u) *reinterpret_cast<uint32_t*>(&lo_tile[lanes.row(e)][4 * (row_sub + g * kRowsPerPass)]) = words[e];
    }
  }
  __syncthreads();
  store_v_tile<D, true>(p, bh, row0, v_tile);
  if constexpr (kVLo) store_lo_tile(p, bh, row0, lo_tile);
}

}  // namespace vc
