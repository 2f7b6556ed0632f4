// Fused preprocessing (see kernels/prepare.py for the operand contract), two passes:
//   stats:    per 128-token block of the permuted order: K column sums (for the K mean), V-Smooth
//             block means (fp16) and the per-channel amax of the V residual (or of V itself).
//   quantize: per 128-token block: Q (one scale per row), smoothed + permuted K, and the
//             E4M3 V residual written transposed (D, n_pad) for the PV MMA.
// Every thread owns 8 consecutive channels of a row (one 16-byte load); D/8 threads cover a row.
#pragma once
#include "common.cuh"
#include "prepare_lowrank.cuh"
#include "prepare_v_lo.cuh"
#include "vc_params.h"

namespace vc {

constexpr int kPrepThreads = 256;
#ifndef VC_PREP_STATS_PREFETCH
#define VC_PREP_STATS_PREFETCH 0  // 1 (variant "stats-prefetch"): the statistics pass loads its permutation indices first
#endif

// The host checks a caller's perm; the node's own grouping perm is trusted without a host sync, so
// the kernel still never reads outside the head: an out-of-range index reads token `slot` instead.
__device__ __forceinline__ int64_t source_token(const PrepareParams& p, int bh, int slot) {
  if (!p.perm) return int64_t(slot);
  const int64_t tok = int64_t(p.perm[int64_t(bh) * p.n + slot]);
  return (tok >= 0 && tok < p.n) ? tok : int64_t(slot);
}

template <typename T>
__device__ __forceinline__ const T* row_ptr(const void* base, const int64_t (&stride)[3], int b, int h, int64_t tok) {
  return static_cast<const T*>(base) + b * stride[0] + h * stride[1] + tok * stride[2];
}

// Sums (or maxes) each channel's 8-value partials over the rows the block covers: partial is
// [rows_per_pass][D]; thread c < D gets channel c's total. Ends with a barrier.
// start: the max's identity (0 for amaxes; -inf for signed values).
template <int D, bool kMax>
__device__ __forceinline__ float reduce_channels(const float (&mine)[8], float (*partial)[D], int row_sub, int c0,
                                                 float start = 0.0f) {
  constexpr int kRowsPerPass = kPrepThreads / (D / 8);
#pragma unroll
  for (int i = 0; i < 8; ++i) partial[row_sub][c0 + i] = mine[i];
  __syncthreads();
  float total = kMax ? start : 0.0f;
  if (threadIdx.x < D) {
    for (int r = 0; r < kRowsPerPass; ++r) total = kMax ? fmaxf(total, partial[r][threadIdx.x]) : total + partial[r][threadIdx.x];
  }
  __syncthreads();
  return total;
}

// The head's K column sums in a fixed order. Float atomics would add the blocks' totals in arrival
// order, so the K mean's last bits (and through the INT8 codes the output) changed from run to run with
// the same inputs. Every block writes its totals (thread c < D: channel c) to its slot of k_partial;
// the head's last block to finish (a counter) adds the slots in block order into k_sum: kSplit threads
// per channel over interleaved blocks with kAcc accumulators each, combined in a fixed order. scratch:
// kPrepThreads floats of shared memory, free on entry (the caller's barrier); ends with a barrier.
template <int D>
__device__ __forceinline__ void k_sum_fixed_order(const PrepareParams& p, int bh, float total, float* scratch) {
  constexpr int kSplit = kPrepThreads / D, kAcc = 8;
  __shared__ bool last;
  const int n_blocks = gridDim.x;
  float* slots = p.k_partial + int64_t(bh) * n_blocks * D;
  if (threadIdx.x < D) slots[int64_t(blockIdx.x) * D + threadIdx.x] = total;
  __threadfence();  // the slot is visible device-wide before the counter says so
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(p.k_done + bh, 1u) == unsigned(n_blocks - 1);
  __syncthreads();
  if (last) {
    __threadfence();
    const int c = threadIdx.x % D, sub = threadIdx.x / D;
    float acc[kAcc] = {};
    for (int j0 = sub; j0 < n_blocks; j0 += kSplit * kAcc) {
#pragma unroll
      for (int u = 0; u < kAcc; ++u) {
        const int j = j0 + u * kSplit;
        if (j < n_blocks) acc[u] += __ldcg(slots + int64_t(j) * D + c);  // L2: written by other blocks
      }
    }
    float sum = acc[0];
#pragma unroll
    for (int u = 1; u < kAcc; ++u) sum += acc[u];
    scratch[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x < D) {
      float head = scratch[threadIdx.x];
#pragma unroll
      for (int q = 1; q < kSplit; ++q) head += scratch[q * D + threadIdx.x];
      p.k_sum[int64_t(bh) * D + threadIdx.x] = head;
    }
  }
  __syncthreads();
}

// The stats kernels' block totals (prepare_stats_kernel, prepare_regs.cuh): the K column sums into
// k_sum (k_sum_fixed_order); with V-Smooth the block's fp16 V mean into v_mean and block_mean (then a barrier, so every
// thread can take the residual's amax against it).
template <int D>
__device__ __forceinline__ void stats_block_sums(const PrepareParams& p, int bh, int valid, const float (&ksum)[8],
                                                 const float (&vacc)[8], float (*partial)[D], float* block_mean,
                                                 int row_sub, int c0) {
  if (p.smooth_k) {
    const float total = reduce_channels<D, false>(ksum, partial, row_sub, c0);
    k_sum_fixed_order<D>(p, bh, total, &partial[0][0]);
  }
  if (p.vsmooth) {
    const float total = reduce_channels<D, false>(vacc, partial, row_sub, c0);
    if (threadIdx.x < D) {
      const __half mean = __float2half_rn(total / float(valid));
      // one mean per 128 rows in the operands: a 256-row block writes its mean into both of its slots
      // (the second only where it exists: an odd n_pad / 128 ends on a single 128-row block)
      const int per = p.v_mean_rows / kKBlock, slots = p.n_pad / kKBlock, first = blockIdx.x * per;
      for (int s = first; s < min(first + per, slots); ++s)
        p.v_mean[(int64_t(bh) * slots + s) * D + threadIdx.x] = __half_as_ushort(mean);
      block_mean[threadIdx.x] = __half2float(mean);
      // V-Smooth segments: the float32 mean the merge compares (reference.vsmooth_segments' m_b)
      if (p.v_merge) p.blk_mean[(int64_t(bh) * gridDim.x + blockIdx.x) * D + threadIdx.x] = total / float(valid);
    }
    __syncthreads();
  }
}

// k_pair (K scales per 256 keys): this thread's part of the smoothed K's amax over the quantize block's
// 256-key scale block (statistics block blockIdx.x / 2), from that block's per-channel extremes. Exactly the
// amax of the rows: fl(x - m) is monotone in x, so its largest magnitude sits at the channel's max or min.
// The statistics blocks are V-Smooth's mean blocks: 256 rows (one per scale block) or, with 128-row means
// (fidelity mode's), 128 rows, of which the pair's one or two are combined here.
template <int D>
__device__ __forceinline__ float k_pair_amax(const PrepareParams& p, int bh, int c0, const float (&k_mean)[8]) {
  const bool halves = p.v_mean_rows == kKBlock;
  const int blocks = halves ? gridDim.x : (gridDim.x + 1) / 2;  // statistics blocks per head
  const int first = halves ? (blockIdx.x & ~1) : blockIdx.x / 2;
  const int last = halves ? min(first + 1, blocks - 1) : first;
  float amax = 0.0f;
  for (int blk_x = first; blk_x <= last; ++blk_x) {
    const int64_t blk = (int64_t(bh) * blocks + blk_x) * D + c0;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      amax = fmaxf(amax, fmaxf(fabsf(__fsub_rn(p.k_blk_max[blk + e], k_mean[e])), fabsf(__fsub_rn(p.k_blk_min[blk + e], k_mean[e]))));
  }
  return amax;
}

// The block's per-channel amax (of the V residual, or of V) into the head's v_amax; with V-Smooth segments
// (p.v_merge) into the block's own slot instead, with the residual's energy (this thread's sum of squares,
// added in a fixed order): prepare_segments_kernel bounds the head's amax from them.
template <int D>
__device__ __forceinline__ void stats_block_amax(const PrepareParams& p, int bh, const float (&vacc)[8], float (*partial)[D],
                                                 int row_sub, int c0, float energy = 0.0f) {
  const float amax = reduce_channels<D, true>(vacc, partial, row_sub, c0);
  if (p.v_merge) {
    const int64_t blk = int64_t(bh) * gridDim.x + blockIdx.x;
    if (threadIdx.x < D) p.blk_amax[blk * D + threadIdx.x] = amax;
    __shared__ float warp_energy[kPrepThreads / 32];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) energy += __shfl_xor_sync(0xffffffffu, energy, off);
    if (threadIdx.x % 32 == 0) warp_energy[threadIdx.x / 32] = energy;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.0f;
      for (int w = 0; w < kPrepThreads / 32; ++w) total += warp_energy[w];
      p.blk_energy[blk] = total;
    }
    return;
  }
  // non-negative floats order like their bit patterns, so an integer max is a float max
  if (threadIdx.x < D) atomicMax(reinterpret_cast<int*>(p.v_amax) + int64_t(bh) * D + threadIdx.x, __float_as_int(amax));
}

// The residual's second term (kVLo): the block's residual energy per channel (this thread's 8 channels' sums) into its
// lo_energy slot, from which prepare_v_lo_select_kernel chooses the head's channels. Starts after a barrier.
template <int D>
__device__ __forceinline__ void v_lo_block_energy(const PrepareParams& p, int bh, const float (&energy)[8], float (*partial)[D],
                                                  int row_sub, int c0) {
  const float total = reduce_channels<D, false>(energy, partial, row_sub, c0);
  if (threadIdx.x < D) p.lo_energy[(int64_t(bh) * gridDim.x + blockIdx.x) * D + threadIdx.x] = total;
}

// kLowRank: the instantiation for p.v_rank > 0 (V-Smooth's low-rank term; its basis rows take ~50
// registers, which the plain kernels must not pay: their occupancy is what makes them fast).
// kKPair: the instantiation for p.k_pair (K scales per 256 keys): the K extremes take 16 registers a
// thread (64 instead of 46), which the other configurations do not pay.
// kVLo: the instantiation for p.v_lo_channels > 0 (the residual's second term): the residual's energy per channel
// (8 more accumulators) into lo_energy, from which prepare_v_lo_select_kernel chooses the channels.
template <typename T, int D, bool kLowRank = false, bool kKPair = false, bool kVLo = false>
__global__ __launch_bounds__(kPrepThreads) void prepare_stats_kernel(const PrepareParams p) {
  static_assert(!kVLo || (!kLowRank && !VC_PREP_STATS_PREFETCH), "the second V term: no low-rank term, the default loop");
  constexpr int kLanesPerRow = D / 8;
  constexpr int kRowsPerPass = kPrepThreads / kLanesPerRow;
  __shared__ float partial[kRowsPerPass][D];
  __shared__ float block_mean[D];

  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  // one block per V-Smooth mean: 128 rows, or 256 (VCConfig.v_mean_rows; the launcher's grid has
  // n_pad / v_mean_rows blocks, rounded up). The K sums and the V amax do not depend on the split.
  const int block_rows = p.v_mean_rows;
  const int row0 = blockIdx.x * block_rows;
  const int valid = min(block_rows, p.n - row0);
  const int c0 = (threadIdx.x % kLanesPerRow) * 8, row_sub = threadIdx.x / kLanesPerRow;

  float ksum[8] = {}, vacc[8] = {};
  // k_pair (K scales per 256 keys: this block, or half of it with 128-row means): the block's K extremes per
  // channel; the quantize pass takes the smoothed K's amax from them once the head's K mean is known (k_pair_amax)
  float kmax[8], kmin[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) kmax[i] = -INFINITY, kmin[i] = INFINITY;
#if VC_PREP_STATS_PREFETCH
  // The variant (VC_PREP_STATS_PREFETCH=1): every permutation index of the thread's rows first, then
  // branch-free row loads (rows past `valid` load row 0 and are not added: a select keeps the accumulator,
  // so the sums are those of the default loop, bit for bit), so the compiler may keep several rows' loads
  // in flight. The default loop waits index load -> K and V loads -> adds, one row at a time (~2.3 TB/s at
  // Wan2.1-1.3B with CFG; at LTX-Video a block's 16 dependent rounds are the whole kernel). A 256-row block
  // (v_mean_rows = 256) runs as two 128-row halves in row order, the same order as the default loop's. The
  // second pass reuses the indices.
  constexpr int kIters = kKBlock / kRowsPerPass;
  const int halves = block_rows / kKBlock;
  int tok[2][kIters];
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int r = half * kKBlock + row_sub + it * kRowsPerPass;
      tok[half][it] = half < halves && r < valid ? int(source_token(p, bh, row0 + r)) : 0;
    }
  auto first_pass = [&](auto smooth_k, auto vsmooth) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        if (half >= halves) continue;  // uniform across the block; no break, so the indices stay constants
        const bool in = half * kKBlock + row_sub + it * kRowsPerPass < valid;
        float x[8];
        if constexpr (decltype(smooth_k)::value) {
          load8_as_float(row_ptr<T>(p.k, p.k_stride, b, h, tok[half][it]) + c0, x);
#pragma unroll
          for (int i = 0; i < 8; ++i) ksum[i] = in ? ksum[i] + x[i] : ksum[i];
        }
        load8_as_float(row_ptr<T>(p.v, p.v_stride, b, h, tok[half][it]) + c0, x);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float next = decltype(vsmooth)::value ? vacc[i] + x[i] : fmaxf(vacc[i], fabsf(x[i]));
          vacc[i] = in ? next : vacc[i];
        }
      }
    }
  };
  if (p.smooth_k) {
    if (p.vsmooth) first_pass(std::true_type{}, std::true_type{}); else first_pass(std::true_type{}, std::false_type{});
  } else {
    if (p.vsmooth) first_pass(std::false_type{}, std::true_type{}); else first_pass(std::false_type{}, std::false_type{});
  }
#else
  for (int r = row_sub; r < valid; r += kRowsPerPass) {
    const int64_t tok = source_token(p, bh, row0 + r);
    float x[8];
    if (p.smooth_k || kKPair) {
      load8_as_float(row_ptr<T>(p.k, p.k_stride, b, h, tok) + c0, x);
#pragma unroll
      for (int i = 0; i < 8; ++i) ksum[i] += x[i];  // (unread without smooth_k)
      if constexpr (kKPair) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          kmax[i] = fmaxf(kmax[i], x[i]);
          kmin[i] = fminf(kmin[i], x[i]);
        }
      }
    }
    load8_as_float(row_ptr<T>(p.v, p.v_stride, b, h, tok) + c0, x);
#pragma unroll
    for (int i = 0; i < 8; ++i) vacc[i] = p.vsmooth ? vacc[i] + x[i] : fmaxf(vacc[i], fabsf(x[i]));
  }
#endif
  stats_block_sums<D>(p, bh, valid, ksum, vacc, partial, block_mean, row_sub, c0);
  if constexpr (kKPair) {
    const int64_t blk = (int64_t(bh) * gridDim.x + blockIdx.x) * D;
    const float top = reduce_channels<D, true>(kmax, partial, row_sub, c0, -INFINITY);
    if (threadIdx.x < D) p.k_blk_max[blk + threadIdx.x] = top;
#pragma unroll
    for (int i = 0; i < 8; ++i) kmin[i] = -kmin[i];
    const float bottom = reduce_channels<D, true>(kmin, partial, row_sub, c0, -INFINITY);
    if (threadIdx.x < D) p.k_blk_min[blk + threadIdx.x] = -bottom;
  }
  float energy = 0.0f;  // the V residual's sum of squares over this thread's rows and channels
  float channel_energy[8] = {};  // kVLo: the same per channel
  if (p.vsmooth) {
#pragma unroll
    for (int i = 0; i < 8; ++i) vacc[i] = 0.0f;
    if constexpr (kLowRank) {  // the low-rank term: amax of R - A W per channel, of A per component
      __shared__ __align__(16) float basis_rows[kMaxVRank][D];
      const LowRankBasis<D> basis = load_basis<D>(p, bh, basis_rows);
      float camax[kMaxVRank] = {};
      for (int r = row_sub; r < valid; r += kRowsPerPass) {
        float x[8];
        load8_as_float(row_ptr<T>(p.v, p.v_stride, b, h, source_token(p, bh, row0 + r)) + c0, x);
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] -= block_mean[c0 + i];
        low_rank_stats_row<D>(x, basis, p.v_rank, c0, vacc, camax);
      }
      low_rank_stats_amax(p, bh, camax);
    } else {
#if VC_PREP_STATS_PREFETCH
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int it = 0; it < kIters; ++it) {
          if (half >= halves) continue;
          const bool in = half * kKBlock + row_sub + it * kRowsPerPass < valid;
          float x[8];
          load8_as_float(row_ptr<T>(p.v, p.v_stride, b, h, tok[half][it]) + c0, x);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const float r = x[i] - block_mean[c0 + i];
            vacc[i] = in ? fmaxf(vacc[i], fabsf(r)) : vacc[i];
            energy = in ? fmaf(r, r, energy) : energy;
          }
        }
      }
#else
      for (int r = row_sub; r < valid; r += kRowsPerPass) {
        float x[8];
        load8_as_float(row_ptr<T>(p.v, p.v_stride, b, h, source_token(p, bh, row0 + r)) + c0, x);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float r = x[i] - block_mean[c0 + i];
          vacc[i] = fmaxf(vacc[i], fabsf(r));
          energy = fmaf(r, r, energy);  // V-Smooth segments only (stats_block_amax); a few FMAs of a memory-bound pass
          if constexpr (kVLo) channel_energy[i] = fmaf(r, r, channel_energy[i]);
        }
      }
#endif
    }
  }
  stats_block_amax<D>(p, bh, vacc, partial, row_sub, c0, energy);
  if constexpr (kVLo) v_lo_block_energy<D>(p, bh, channel_energy, partial, row_sub, c0);
}

// A thread's 8 channels times inv -> 8 codes (E4M3 or INT8), first channel in the lowest byte.
template <bool kFp8>
__device__ __forceinline__ uint2 codes8(const float (&x)[8], float inv) {
  if constexpr (kFp8) {
    return make_uint2(e4m3x4(x[0] * inv, x[1] * inv, x[2] * inv, x[3] * inv), e4m3x4(x[4] * inv, x[5] * inv, x[6] * inv, x[7] * inv));
  } else {
    return make_uint2(int8_code(x[0] * inv) | int8_code(x[1] * inv) << 8 | int8_code(x[2] * inv) << 16 | int8_code(x[3] * inv) << 24,
                      int8_code(x[4] * inv) | int8_code(x[5] * inv) << 8 | int8_code(x[6] * inv) << 16 | int8_code(x[7] * inv) << 24);
  }
}

// Quantizes `rows` rows starting at slot row0 as one scale block: pass 1 finds the block amax,
// pass 2 writes the codes (zeros for padded rows) to dst (contiguous rows of D bytes).
// load(slot, x) fills the 8 transformed floats of this thread's channels. Returns the scale.
template <int D, bool kFp8, typename Load>
__device__ __forceinline__ float quantize_row_block(int row0, int rows, int valid, uint8_t* dst, float* scratch, Load load) {
  constexpr int kLanesPerRow = D / 8;
  constexpr int kRowsPerPass = kPrepThreads / kLanesPerRow;
  const int c0 = (threadIdx.x % kLanesPerRow) * 8, row_sub = threadIdx.x / kLanesPerRow;
  float amax = 0.0f;
  for (int r = row_sub; r < valid; r += kRowsPerPass) {
    float x[8];
    load(row0 + r, x);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(x[i]));
  }
  amax = block_max(amax, scratch);
  const float limit = kFp8 ? kE4m3Max : kInt8Max;
  const float inv = amax > 0.0f ? (1.0f / amax) * limit : 0.0f;  // torch's `limit / t` is reciprocal(t) * limit
  for (int r = row_sub; r < rows; r += kRowsPerPass) {
    uint2 codes = make_uint2(0u, 0u);
    if (r < valid) {
      float x[8];
      load(row0 + r, x);
      codes = codes8<kFp8>(x, inv);
    }
    *reinterpret_cast<uint2*>(dst + int64_t(r) * D + c0) = codes;
  }
  return amax / limit;
}

// One row's quantization with its own scale, by the D/8 consecutive lanes that hold its 8-channel
// slices x (zeros for a padded row: zero codes, zero scale): the row amax by shuffles, the codes to
// dst (this slice's bytes), the scale to *scale_dst from the row's first lane. All lanes must call it.
template <int D, bool kFp8>
__device__ __forceinline__ void quantize_row_slice(const float (&x)[8], uint8_t* dst, float* scale_dst, int c0) {
  constexpr int kLanesPerRow = D / 8;
  const float limit = kFp8 ? kE4m3Max : kInt8Max;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
  for (int lanes = kLanesPerRow / 2; lanes > 0; lanes /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, lanes));
  const float inv = amax > 0.0f ? (1.0f / amax) * limit : 0.0f;  // as quantize_row_block
  *reinterpret_cast<uint2*>(dst) = codes8<kFp8>(x, inv);
  if (c0 == 0) *scale_dst = amax / limit;
}

// Quantizes `rows` rows starting at slot row0 with one scale per row (Q): the D/8 threads of a row are
// consecutive lanes of one warp and reduce its amax by shuffles, so a row is loaded once. Rows at or
// past `valid` get zero codes and a zero scale; scale_dst[r] receives row r's scale.
template <int D, bool kFp8, typename Load>
__device__ __forceinline__ void quantize_rows(int row0, int rows, int valid, uint8_t* dst, float* scale_dst, Load load) {
  constexpr int kLanesPerRow = D / 8;
  constexpr int kRowsPerPass = kPrepThreads / kLanesPerRow;
  static_assert(32 % kLanesPerRow == 0, "a row's threads must sit in one warp");
  const int c0 = (threadIdx.x % kLanesPerRow) * 8, row_sub = threadIdx.x / kLanesPerRow;
  dst += int64_t(row_sub) * D;
  scale_dst += row_sub;
  // every thread runs the same trip count (rows is a multiple of kRowsPerPass): full-warp shuffles
  for (int r = row_sub; r < rows; r += kRowsPerPass) {
    float x[8] = {};
    if (r < valid) load(row0 + r, x);
    quantize_row_slice<D, kFp8>(x, dst + c0, scale_dst, c0);
    dst += kRowsPerPass * D;
    scale_dst += kRowsPerPass;
  }
}

// The channel's residual amax behind its scale: the statistics pass's, or with the low-rank term its bound.
template <int D>
__device__ __forceinline__ float v_channel_amax(const PrepareParams& p, int bh, int c) {
  const float amax = p.v_amax[int64_t(bh) * D + c];
  return p.v_rank ? low_rank_residual_bound<D>(p, bh, c, amax) : amax;
}

// The V codes' parameters of this thread's 8 channels: the block's fp16 mean (0 without V-Smooth) and
// E4M3 max / channel amax; block 0 of each head also writes the head's v_scale.
template <int D>
__device__ __forceinline__ void v_code_params(const PrepareParams& p, int bh, int c0, float (&v_mean)[8], float (&v_inv)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = c0 + i;
    v_mean[i] = p.vsmooth ? __half2float(__ushort_as_half(p.v_mean[(int64_t(bh) * gridDim.x + blockIdx.x) * D + c])) : 0.0f;
    const float amax = v_channel_amax<D>(p, bh, c);
    v_inv[i] = amax > 0.0f ? (1.0f / amax) * kE4m3Max : 0.0f;
  }
  if (blockIdx.x == 0 && threadIdx.x < D) {
    const float amax = v_channel_amax<D>(p, bh, threadIdx.x);
    p.v_scale[int64_t(bh) * D + threadIdx.x] = amax > 0.0f ? amax / kE4m3Max : 1.0f;
  }
}

// The block's extra V^T rows (filled and followed by a barrier) to v_low_t, 16 bytes per store.
__device__ __forceinline__ void store_low_tile(const PrepareParams& p, int bh, int row0, const uint8_t (*low_tile)[kKBlock + 16]) {
  constexpr int kChunksPerRow = kKBlock / 16;
  for (int idx = threadIdx.x; idx < kVLowRows * kChunksPerRow; idx += kPrepThreads) {
    const int row = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
    *reinterpret_cast<uint4*>(p.v_low_t + (int64_t(bh) * kVLowRows + row) * p.n_pad + row0 + chunk * 16) =
        *reinterpret_cast<const uint4*>(&low_tile[row][chunk * 16]);
  }
}

// The staged quantize kernel's V^T tile swizzle (prepare_staged.cuh): the 4-byte word w (tokens 4w..4w+3)
// of channel c's row sits at word w ^ v_tile_swizzle<D>(c). Its 32-bit stores (a lane's 8 channels,
// D/8 lanes per token row) then hit 32 distinct banks per warp; unswizzled, the lanes storing the same
// token word of channels 8 apart all hit one bank (row pitch 144 B = 36 words, 8 x 36 = 0 mod 32).
template <int D>
__device__ __forceinline__ int v_tile_swizzle(int c) {
  return (c >> 3) * (256 / D);  // < 32: an XOR inside the row's 32 words
}

// The block's transposed V codes (filled and followed by a barrier) to v_t, 16 bytes per store.
// kSwizzled: the tile was written with v_tile_swizzle (16-byte chunk and word order undone here).
template <int D, bool kSwizzled = false>
__device__ __forceinline__ void store_v_tile(const PrepareParams& p, int bh, int row0, const uint8_t (*v_tile)[kKBlock + 16]) {
  constexpr int kChunksPerRow = kKBlock / 16;
  for (int idx = threadIdx.x; idx < D * kChunksPerRow; idx += kPrepThreads) {
    const int d = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
    const int s = kSwizzled ? v_tile_swizzle<D>(d) : 0;
    // logical word j of this chunk is physical word j ^ (s & 3) of chunk chunk ^ (s >> 2)
    uint4 u = *reinterpret_cast<const uint4*>(&v_tile[d][(chunk ^ (s >> 2)) * 16]);
    if (s & 1) u = make_uint4(u.y, u.x, u.w, u.z);
    if (s & 2) u = make_uint4(u.z, u.w, u.x, u.y);
    *reinterpret_cast<uint4*>(p.v_t + (int64_t(bh) * D + d) * p.n_pad + row0 + chunk * 16) = u;
  }
}

template <typename T, int D, bool kQkFp8, bool kLowRank = false>
__global__ __launch_bounds__(kPrepThreads) void prepare_quantize_kernel(const PrepareParams p) {
  constexpr int kLanesPerRow = D / 8;
  constexpr int kRowsPerPass = kPrepThreads / kLanesPerRow;
  __shared__ float scratch[32];
  __shared__ __align__(16) uint8_t v_tile[D][kKBlock + 16];  // transposed codes; rows stay 16-byte aligned

  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int row0 = blockIdx.x * kKBlock;
  const int valid = min(kKBlock, p.n - row0);
  const int c0 = (threadIdx.x % kLanesPerRow) * 8, row_sub = threadIdx.x / kLanesPerRow;
  const int64_t bh_rows = int64_t(bh) * p.n_pad;

  // Q: one scale per row, token order unchanged, scores pre-scaled into log2 units
  auto load_q = [&](int slot, float (&x)[8]) {
    load8_as_float(row_ptr<T>(p.q, p.q_stride, b, h, slot) + c0, x);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] *= p.qk_scale;
  };
  quantize_rows<D, kQkFp8>(row0, kKBlock, valid, static_cast<uint8_t*>(p.q_q) + (bh_rows + row0) * D,
                           p.q_scale + bh_rows + row0, load_q);

  // K: smoothed by the mean over all tokens, gathered in permuted order
  float k_mean[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) k_mean[i] = p.smooth_k ? p.k_sum[int64_t(bh) * D + c0 + i] / float(p.n) : 0.0f;
  auto load_k = [&](int slot, float (&x)[8]) {
    load8_as_float(row_ptr<T>(p.k, p.k_stride, b, h, source_token(p, bh, slot)) + c0, x);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] -= k_mean[i];
  };
  const float k_scale = quantize_row_block<D, kQkFp8>(row0, kKBlock, valid, static_cast<uint8_t*>(p.k_q) + (bh_rows + row0) * D,
                                                      scratch, load_k);
  if (threadIdx.x == 0) p.k_scale[int64_t(bh) * gridDim.x + blockIdx.x] = k_scale;

  // V: residual against the fp16 block mean (V-Smooth) or V itself, per-channel E4M3, transposed
  float v_mean[8], v_inv[8];
  v_code_params<D>(p, bh, c0, v_mean, v_inv);
  if constexpr (kLowRank) {
    // the low-rank term (prepare_lowrank.cuh): the residual R - A_q W, and the extra V^T rows (ones on
    // this tile's parity row, the coefficient codes in rows kVLowFirst..)
    __shared__ __align__(16) uint8_t low_tile[kVLowRows][kKBlock + 16];
    for (int idx = threadIdx.x; idx < 2 * kKBlock; idx += kPrepThreads)
      low_tile[idx / kKBlock][idx % kKBlock] = (idx / kKBlock) == (blockIdx.x & 1) ? uint8_t(kE4m3OneCode) : 0;
    __shared__ __align__(16) float basis_rows[kMaxVRank][D];
    const LowRankBasis<D> basis = load_basis<D>(p, bh, basis_rows);
    const LowRankCodes codes = low_rank_code_params<D>(p, bh);
    for (int r = row_sub; r < kKBlock; r += kRowsPerPass) {  // every lane of a row takes part: shuffles
      float x[8] = {};
      if (r < valid) {
        load8_as_float(row_ptr<T>(p.v, p.v_stride, b, h, source_token(p, bh, row0 + r)) + c0, x);
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] -= v_mean[i];
      }
      uint8_t a_codes[kMaxVRank];
      low_rank_quantize_row<D>(x, basis, codes, p.v_rank, c0, a_codes);
      if (c0 == 0) {
#pragma unroll
        for (int k = 0; k < kMaxVRank; ++k) low_tile[kVLowFirst + k][r] = a_codes[k];
      }
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const uint16_t two = r < valid ? e4m3x2(x[i] * v_inv[i], x[i + 1] * v_inv[i + 1]) : 0;
        v_tile[c0 + i][r] = uint8_t(two & 0xFF);
        v_tile[c0 + i + 1][r] = uint8_t(two >> 8);
      }
    }
    __syncthreads();
    store_v_tile<D>(p, bh, row0, v_tile);
    store_low_tile(p, bh, row0, low_tile);
  } else {
    for (int r = row_sub; r < kKBlock; r += kRowsPerPass) {
      float x[8] = {};
      if (r < valid) load8_as_float(row_ptr<T>(p.v, p.v_stride, b, h, source_token(p, bh, row0 + r)) + c0, x);
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const uint16_t two = r < valid ? e4m3x2((x[i] - v_mean[i]) * v_inv[i], (x[i + 1] - v_mean[i + 1]) * v_inv[i + 1]) : 0;
        v_tile[c0 + i][r] = uint8_t(two & 0xFF);
        v_tile[c0 + i + 1][r] = uint8_t(two >> 8);
      }
    }
    __syncthreads();
    store_v_tile<D>(p, bh, row0, v_tile);
  }
}

}  // namespace vc
