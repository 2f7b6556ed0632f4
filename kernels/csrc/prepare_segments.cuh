// V-Smooth segments (VCConfig.v_mean_merge; the spec is kernels/reference.py vsmooth_segments): after the
// statistics pass has left each 256-row block's float32 mean, per-channel residual amax and residual
// energy in the workspace, one CTA per (batch, head) merges the blocks whose means agree into segments,
// writes each segment's fp16 mean into all of its 128-row slots, marks the segment ends for the Hopper
// speed loop, and replaces the head's residual amax by the bound max_b (a_b + |mu_b - mu_seg|) that the
// quantize pass scales by.
// The merge is sequential by nature (a block joins the segment its predecessors opened): warp 0 walks the
// blocks from shared memory, which the whole CTA fills a chunk at a time (a walk over global memory waited
// one load latency per block: ~0.1 ms a call at Wan2.1-1.3B); everything else is a parallel pass.
#pragma once
#include "prepare.cuh"

namespace vc {

constexpr float kMergeInvKappa2 = 9.0f;  // reference.V_MERGE_INV_KAPPA2
constexpr int kSegThreads = 256;
constexpr int kSegChunk = 32;  // blocks staged in shared memory per round of the walk

template <int D>
__global__ __launch_bounds__(kSegThreads) void prepare_segments_kernel(const PrepareParams p) {
  constexpr int C = D / 32;  // channels per lane in the walk: lane + 32 i
  constexpr int kWarps = kSegThreads / 32;
  __shared__ float chunk_mean[kSegChunk][D];
  __shared__ float chunk_energy[kSegChunk];
  __shared__ float warp_bound[kWarps][D];
  const int bh = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nb = (p.n_pad + 2 * kKBlock - 1) / (2 * kKBlock), slots = p.n_pad / kKBlock;
  const float* m = p.blk_mean + int64_t(bh) * nb * D;
  const float* a = p.blk_amax + int64_t(bh) * nb * D;
  const float* e = p.blk_energy + int64_t(bh) * nb;
  int* seg_first = p.blk_seg_first + int64_t(bh) * nb;  // each block's segment's first block
  uint16_t* means = p.v_mean + int64_t(bh) * slots * D;
  auto rows_of = [&](int j) { return float(min(2 * kKBlock, p.n - 2 * kKBlock * j)); };

  // the walk's state (warp 0): the open segment's first block, anchor mean, float32 sum and rows
  float anchor[C], total[C], rows = 0.0f;
  int start = 0;
  // the open segment's fp16 mean into its first block's first slot (the parallel pass copies it on)
  auto close = [&]() {
#pragma unroll
    for (int i = 0; i < C; ++i)
      means[int64_t(2 * start) * D + lane + 32 * i] = __half_as_ushort(__float2half_rn(__fdiv_rn(total[i], rows)));
  };
  for (int c0 = 0; c0 < nb; c0 += kSegChunk) {
    const int count = min(kSegChunk, nb - c0);
    for (int i = threadIdx.x; i < count * D; i += kSegThreads) chunk_mean[i / D][i % D] = m[int64_t(c0) * D + i];
    if (threadIdx.x < count) chunk_energy[threadIdx.x] = e[c0 + threadIdx.x];
    __syncthreads();
    if (warp == 0) {
      for (int jj = 0; jj < count; ++jj) {
        const int j = c0 + jj;
        const float rj = rows_of(j);
        bool joins = false;
        if (j > 0) {
          float shift2 = 0.0f;
#pragma unroll
          for (int i = 0; i < C; ++i) {
            const float d = __fsub_rn(chunk_mean[jj][lane + 32 * i], anchor[i]);
            shift2 = __fadd_rn(shift2, __fmul_rn(d, d));
          }
#pragma unroll
          for (int off = 16; off > 0; off >>= 1) shift2 += __shfl_xor_sync(0xffffffffu, shift2, off);
          // warp-uniform: every lane holds the same shift2 after the butterfly
          joins = __fmul_rn(__fmul_rn(kMergeInvKappa2, shift2), rj) <= chunk_energy[jj];
        }
        if (!joins) {
          if (j > 0) close();
          start = j;
          rows = 0.0f;
#pragma unroll
          for (int i = 0; i < C; ++i) {
            anchor[i] = chunk_mean[jj][lane + 32 * i];
            total[i] = 0.0f;
          }
        }
#pragma unroll
        for (int i = 0; i < C; ++i) total[i] = __fadd_rn(total[i], __fmul_rn(chunk_mean[jj][lane + 32 * i], rj));
        rows += rj;
        if (lane == 0) seg_first[j] = start;
      }
      if (c0 + count == nb) close();
    }
    __syncthreads();  // the walk is done with the chunk (and, at the end, its writes are visible to the CTA)
  }

  // the parallel pass: every block's slots and end flags, and its share of the amax bound
  float bound[D / 32] = {};
  for (int j = warp; j < nb; j += kWarps) {
    const int first = seg_first[j];
    const bool ends = j == nb - 1 || seg_first[j + 1] != first;
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
      const int c = lane + 32 * i;
      const uint16_t mu_seg = means[int64_t(2 * first) * D + c];
      const float mu_b = __half2float(__float2half_rn(m[int64_t(j) * D + c]));
      const float shift = fabsf(__fsub_rn(mu_b, __half2float(__ushort_as_half(mu_seg))));
      bound[i] = fmaxf(bound[i], __fadd_rn(a[int64_t(j) * D + c], shift));
      if (j != first) means[int64_t(2 * j) * D + c] = mu_seg;
      if (2 * j + 1 < slots) means[int64_t(2 * j + 1) * D + c] = mu_seg;
    }
    if (lane < 2 && 2 * j + lane < slots) {
      // the block's last slot ends the segment if the block does (a lone last slot ends its block)
      const bool last_slot = lane == 1 || 2 * j + 1 >= slots;
      p.v_seg_end[int64_t(bh) * slots + 2 * j + lane] = last_slot && ends ? 1 : 0;
    }
  }
#pragma unroll
  for (int i = 0; i < D / 32; ++i) warp_bound[warp][lane + 32 * i] = bound[i];
  __syncthreads();
  if (threadIdx.x < D) {
    float head = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) head = fmaxf(head, warp_bound[w][threadIdx.x]);
    p.v_amax[int64_t(bh) * D + threadIdx.x] = head;
  }
}

}  // namespace vc
