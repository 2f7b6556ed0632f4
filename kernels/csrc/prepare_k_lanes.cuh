// K scales per MMA lane (VCConfig.k_lane_scales; the spec: kernels/k_lanes.py): one block per 256-key K-scale
// block of a head, between the statistics pass (which has the head's K mean) and the quantize pass.
//   1. its 256 K rows, gathered through the grouping's perm and smoothed, staged in registers; each row's amax;
//   2. every row's rank in its 128-key half (keys with a larger amax, ties by position: the spec's stable sort),
//      its position lane_position(rank) (a partial half keeps its order); each lane's amax over both halves;
//   3. the INT8 codes at their positions with their lane's scale, the four scales into both 128-key slots, and
//      k_order (the local source row of every position), which the quantize pass's V gather follows, so that K and
//      V stay paired. The quantize pass then skips K.
// The K rows are read from DRAM once here and not in the quantize pass, so the prepare's traffic is unchanged; one
// launch more. Step 3 reads them again, from L2 (the block read them a few microseconds before): holding the 16
// rows of a thread in registers across the two barriers took 164 registers in the bf16 build, one block per SM,
// whose three phases then ran one after another with nothing to overlap them (+0.75 ms at Wan2.2-14B 720p on the
// H200, docs/kernel-notes.md section 35). Re-read, the rows live only inside each phase.
#pragma once
#include "prepare.cuh"

namespace vc {

constexpr int kLaneKeysPerBlock = kKBlock / kKLanes;  // 32: one quartile of a 128-key block per lane
// two blocks of 256 threads per SM (at most 128 registers): one block's loads overlap the other's rank and stores
#ifndef VC_PREP_K_LANES_MIN_BLOCKS
#define VC_PREP_K_LANES_MIN_BLOCKS 2
#endif
constexpr int kKLanesMinBlocks = VC_PREP_K_LANES_MIN_BLOCKS;

// reference k_lanes.lane_position: rank r -> lane r / 32, that lane's (r % 32)-th key (16 a + 4 lane + b)
__device__ __forceinline__ int lane_position(int rank) {
  const int lane = rank / kLaneKeysPerBlock, i = rank % kLaneKeysPerBlock;
  return kKLanes * kKLaneKeys * (i / kKLaneKeys) + kKLaneKeys * lane + i % kKLaneKeys;
}

__device__ __forceinline__ int lane_of_key(int j) { return (j % (kKLanes * kKLaneKeys)) / kKLaneKeys; }

template <typename T, int D>
__global__ __launch_bounds__(kPrepThreads, kKLanesMinBlocks) void prepare_k_lanes_kernel(const PrepareParams p) {
  constexpr int kLanesPerRow = D / 8;
  constexpr int kRowsPerPass = kPrepThreads / kLanesPerRow;
  constexpr int kBlockRows = 2 * kKBlock;  // one K scale per 256 keys (the config requires k_scale_rows 256)
  constexpr int kRows = kBlockRows / kRowsPerPass;  // 16 at D=128, 8 at D=64
  static_assert(kPrepThreads == kBlockRows, "one thread per row of the block ranks it");
  static_assert(32 % kLanesPerRow == 0, "a row's threads must sit in one warp");
  __shared__ float row_amax[kBlockRows];
  __shared__ int pos_of_row[kBlockRows];
  __shared__ unsigned int lane_amax_bits[kKLanes];  // non-negative floats order as their bits

  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int row0 = blockIdx.x * kBlockRows;
  const int valid = min(kBlockRows, p.n - row0);
  const int c0 = (threadIdx.x % kLanesPerRow) * 8, row_sub = threadIdx.x / kLanesPerRow;
  if (threadIdx.x < kKLanes) lane_amax_bits[threadIdx.x] = 0u;

  float k_mean[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) k_mean[e] = p.smooth_k ? p.k_sum[int64_t(bh) * D + c0 + e] / float(p.n) : 0.0f;
  // this thread's 8 columns of its i-th row (gathered through the perm), as loaded: step 1 and step 3 each load all
  // kRows first, then use them, so both phases keep kRows loads in flight
  auto load_rows = [&](uint4 (&raw)[kRows]) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = row_sub + i * kRowsPerPass;
      raw[i] = r < valid ? *reinterpret_cast<const uint4*>(row_ptr<T>(p.k, p.k_stride, b, h, source_token(p, bh, row0 + r)) + c0)
                         : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  auto smoothed = [&](const uint4& raw, float (&x)[8]) {
    unpack8_as_float<T>(raw, x);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] -= k_mean[e];
  };
  // 1. row amax (the row's kLanesPerRow threads are consecutive lanes of one warp; every thread runs every trip)
  {
    uint4 raw[kRows];
    load_rows(raw);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      float x[8];
      smoothed(raw[i], x);
      float a = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) a = fmaxf(a, fabsf(x[e]));
#pragma unroll
      for (int o = kLanesPerRow / 2; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
      if (threadIdx.x % kLanesPerRow == 0) row_amax[row_sub + i * kRowsPerPass] = a;
    }
  }
  __syncthreads();
  // 2. thread r ranks row r within its half; a full half is sorted, a partial one (the head's tail) is not
  {
    const int r = threadIdx.x, half = r / kKBlock, first = half * kKBlock;
    const bool sorted = valid - first >= kKBlock;
    int pos = r - first;
    if (sorted) {
      const float a = row_amax[r];
      int rank = 0;
      for (int j = first; j < first + kKBlock; ++j) {
        const float aj = row_amax[j];
        rank += (aj > a) || (aj == a && j < r);
      }
      pos = lane_position(rank);
    }
    pos_of_row[r] = first + pos;
    if (r < valid) atomicMax(&lane_amax_bits[lane_of_key(pos)], __float_as_uint(row_amax[r]));
    // the V gather's map: position -> local source row (the identity past a partial half's valid rows)
    if (row0 + r < p.n_pad) p.k_order[int64_t(bh) * p.n_pad + row0 + first + pos] = uint8_t(r - first);
  }
  __syncthreads();
  // 3. scales and codes at the rows' positions
  const int slots = p.n_pad / kKBlock, slot0 = row0 / kKBlock;
  if (threadIdx.x < 2 * kKLanes && slot0 + threadIdx.x / kKLanes < slots)
    p.k_scale[(int64_t(bh) * slots + slot0 + threadIdx.x / kKLanes) * kKLanes + threadIdx.x % kKLanes] =
        __uint_as_float(lane_amax_bits[threadIdx.x % kKLanes]) / kInt8Max;
  uint8_t* dst = static_cast<uint8_t*>(p.k_q) + (int64_t(bh) * p.n_pad + row0) * D;
  uint4 raw[kRows];
  load_rows(raw);  // from L2 (step 1 read them)
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = row_sub + i * kRowsPerPass;
    if (row0 + r >= p.n_pad) continue;  // an odd n_pad / 128 ends on a lone 128-key half
    const int pos = pos_of_row[r];
    uint2 codes = make_uint2(0u, 0u);
    if (r < valid) {
      float x[8];
      smoothed(raw[i], x);
      const float amax = __uint_as_float(lane_amax_bits[lane_of_key(pos)]);  // as quantize_row_block: (1 / amax) 127
      codes = codes8<false>(x, amax > 0.0f ? (1.0f / amax) * kInt8Max : 0.0f);
    }
    *reinterpret_cast<uint2*>(dst + int64_t(pos) * D + c0) = codes;
  }
}

}  // namespace vc
