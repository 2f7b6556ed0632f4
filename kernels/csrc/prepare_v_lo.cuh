// V-Smooth's residual with a second E4M3 term on its busiest channels (VCConfig.v_lo_channels; the spec:
// kernels/reference.py quantize_v_vsmooth's lo_channels and v_lo_channel_policy; operands v_lo_t, v_lo_sel).
//   statistics pass: each block leaves its residual energy sum_j r_jc^2 per channel in lo_energy (prepare.cuh's
//     kernel, kVLo);
//   prepare_v_lo_select_kernel (quantize half, after the segments): one CTA per head adds the blocks' energies in a
//     fixed order (with segments moved onto the segment means) and writes the head's L channels with the most energy
//     to v_lo_sel, ascending;
//   quantize pass: with x the first term's scaled residual and hi = E4M3(x), the chosen channels' lo = E4M3(x - hi)
//     go to v_lo_t, channel-major as v_t (prepare_staged.cuh's kernel, kVLo).
// The choice is a policy, not the quantizer's arithmetic: float32 energies may order near-ties otherwise than the
// spec's float64 ones. Given the channels, the codes are the spec's bit for bit.
// The head's sums run in a kernel of their own rather than in each head's last statistics block (as the K sums do):
// sharing that tail with the K sums compiled the default statistics kernels differently (46 -> 47 registers, sm_90a).
#pragma once
#include <cuda_fp8.h>

#include "common.cuh"
#include "vc_params.h"

namespace vc {

// Chooses the head's channels (thread c < D holds channel c's energy; every thread of the block calls it) and writes
// them ascending to v_lo_sel. Channel c's rank is the number of channels with more energy, or as much and a lower
// index (the spec's stable sort): a strict order, so exactly v_lo_channels are chosen, ties included. The keys are
// the energies' magnitude bits, which order non-negative floats as floats and put a NaN (NaN in V) above inf: the
// count holds there too. scratch: 2 D words of shared memory. Starts and ends with a barrier.
template <int D>
__device__ __forceinline__ void v_lo_select(const PrepareParams& p, int bh, float energy, uint32_t* scratch) {
  uint32_t* key = scratch;
  uint32_t* chosen = scratch + D;
  const int c = threadIdx.x;
  __syncthreads();  // the caller's reads of the scratch are done
  if (c < D) key[c] = __float_as_uint(energy) & 0x7FFFFFFFu;
  __syncthreads();
  int rank = D;
  if (c < D) {
    rank = 0;
    const uint32_t mine = key[c];
    for (int o = 0; o < D; ++o) rank += key[o] > mine || (key[o] == mine && o < c);
    chosen[c] = rank < p.v_lo_channels;
  }
  __syncthreads();
  if (c < D && rank < p.v_lo_channels) {
    int slot = 0;  // chosen channels below c: the output is ascending
    for (int o = 0; o < c; ++o) slot += chosen[o];
    p.v_lo_sel[int64_t(bh) * p.v_lo_channels + slot] = c;
  }
  __syncthreads();
}

constexpr int kVLoSelectThreads = 256;

// One CTA per head: the head's residual energy per channel from its statistics blocks' (kSplit threads per channel
// over interleaved blocks, then in thread order: a fixed order, so the choice is the same from run to run), then the
// channel choice. With V-Smooth segments the statistics pass's energy is against each block's own fp16 mean mu_b,
// the first term's residual against its segment's mu_seg: about the block's float32 mean m the cross terms vanish, so
// sum (v - mu_seg)^2 = sum (v - mu_b)^2 + rows ((m - mu_seg)^2 - (m - mu_b)^2) (a policy's input: float32 cancellation
// here matters as little as the summation order).
template <int D>
__global__ __launch_bounds__(kVLoSelectThreads) void prepare_v_lo_select_kernel(const PrepareParams p) {
  constexpr int kSplit = kVLoSelectThreads / D;
  static_assert(kSplit * D >= 2 * D, "the shared sums serve as v_lo_select's scratch");
  __shared__ float partial[kSplit][D];
  const int bh = blockIdx.x, c = threadIdx.x % D, sub = threadIdx.x / D;
  const int blocks = (p.n_pad + p.v_mean_rows - 1) / p.v_mean_rows, slots = p.n_pad / kKBlock;
  const float* energy_of = p.lo_energy + int64_t(bh) * blocks * D + c;
  float energy = 0.0f;
#pragma unroll 4
  for (int j = sub; j < blocks; j += kSplit) {
    float e = energy_of[int64_t(j) * D];
    if (p.v_merge) {  // 256-row blocks (prepare_refusal), each with its slots 2 j and 2 j + 1
      const float m = p.blk_mean[(int64_t(bh) * blocks + j) * D + c];
      const float to_own = m - __half2float(__float2half_rn(m));
      const float to_seg = m - __half2float(__ushort_as_half(p.v_mean[(int64_t(bh) * slots + 2 * j) * D + c]));
      e += float(min(p.v_mean_rows, p.n - p.v_mean_rows * j)) * (to_seg * to_seg - to_own * to_own);
    }
    energy += e;
  }
  partial[sub][c] = energy;
  __syncthreads();
  float head = 0.0f;
  if (threadIdx.x < D) {
#pragma unroll
    for (int q = 0; q < kSplit; ++q) head += partial[q][threadIdx.x];
  }
  v_lo_select<D>(p, bh, head, reinterpret_cast<uint32_t*>(&partial[0][0]));
}

// Which of a thread's channels c0..c0+7 carry the second term (bit e: channel c0 + e) and how many chosen channels lie
// below c0; v_lo_sel being ascending, channel c0 + e's row of v_lo_t is row(e).
struct VLoLanes {
  uint32_t bits;
  int below;
  __device__ __forceinline__ int row(int e) const { return below + __popc(bits & ((1u << e) - 1u)); }
};

__device__ __forceinline__ VLoLanes v_lo_lanes(const PrepareParams& p, int bh, int c0) {
  VLoLanes lanes{0u, 0};
  const int32_t* sel = p.v_lo_sel + int64_t(bh) * p.v_lo_channels;
  for (int i = 0; i < p.v_lo_channels; ++i) {
    const int c = sel[i];
    lanes.below += c < c0;
    if (c >= c0 && c < c0 + 8) lanes.bits |= 1u << (c - c0);
  }
  return lanes;
}

// Two E4M3 codes (bits 0-7, 8-15) as floats, exactly (every E4M3 value is an fp16 value).
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xFFFFu), __NV_E4M3);
  return __half22float2(__half2(raw));
}

// A row's second-term codes of 8 channels: x the first term's scaled residual, first03 / first47 its codes of channels
// 0-3 / 4-7 (e4m3x4's packing); lo = E4M3(x - hi), x - hi exact in float32 (hi is x's nearest E4M3 value, or 448 for
// an x just past it). __fsub_rn: a contraction of x's multiply into the subtraction (one FMA) would round
// differently from the spec, which rounds x first.
__device__ __forceinline__ uint2 v_lo_codes8(const float (&x)[8], uint32_t first03, uint32_t first47) {
  float err[8];
  const uint32_t first[2] = {first03, first47};
#pragma unroll
  for (int w = 0; w < 2; ++w) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float2 hi = e4m3x2_to_float2(first[w] >> (16 * k));
      err[4 * w + 2 * k] = __fsub_rn(x[4 * w + 2 * k], hi.x);
      err[4 * w + 2 * k + 1] = __fsub_rn(x[4 * w + 2 * k + 1], hi.y);
    }
  }
  return make_uint2(e4m3x4(err[0], err[1], err[2], err[3]), e4m3x4(err[4], err[5], err[6], err[7]));
}

// The block's second-term rows (filled and followed by a barrier) to v_lo_t, 16 bytes per store.
__device__ __forceinline__ void store_lo_tile(const PrepareParams& p, int bh, int row0, const uint8_t (*lo_tile)[kKBlock + 16]) {
  constexpr int kChunksPerRow = kKBlock / 16;
  for (int idx = threadIdx.x; idx < p.v_lo_channels * kChunksPerRow; idx += blockDim.x) {
    const int row = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
    *reinterpret_cast<uint4*>(p.v_lo_t + (int64_t(bh) * p.v_lo_channels + row) * p.n_pad + row0 + chunk * 16) =
        *reinterpret_cast<const uint4*>(&lo_tile[row][chunk * 16]);
  }
}

}  // namespace vc
