// The within-cluster order of V-Smooth's grouping (spec: kernels/grouping_within.py): each cluster's
// tokens, a contiguous range of the label-sorted permutation, stably sorted by their bin along the
// cluster's chain direction c_next - c_prev. One block per (cluster, group):
//   1. the range's start (the counts before it) and the direction (fp16 centroids -> float32);
//   2. one warp per token (four in flight per warp): the key v_t . direction (lane-sliced dot product,
//      xor-shuffle sum, so every lane holds the same float), written to the scratch slot; the block's min / max;
//   3. the bins' histogram (integer shared-memory adds) and its exclusive scan;
//   4. the stable scatter in chunks of 256 slots, as group_permute_kernel does with labels.
// Deterministic (no float atomics; the keys' summation order is fixed), no host synchronization.
#pragma once

#include "grouping.cuh"

namespace vc {

// The bin of `key` in its cluster (grouping_within.token_bins): `scale` = bins / (hi - lo), 0 when the
// width is not finite and positive (then every key is in bin 0); a NaN key is in bin 0.
__device__ __forceinline__ int within_bin(float key, float lo, float scale, int bins) {
  const float f = __fmul_rn(__fsub_rn(key, lo), scale);
  return f >= 0.f ? min(bins - 1, int(f)) : 0;  // f >= 0: truncation is floor; f <= bins (1 + 2^-23)
}

static_assert(kRefineThreads == kPermThreads, "the bins' scatter is stable_scatter_step's block of kPermThreads");

template <typename T, int D>
__global__ void __launch_bounds__(kRefineThreads) group_refine_kernel(const RefineParams p) {
  constexpr int kWarps = kRefineThreads / 32;
  constexpr int kPerLane = D / 32;  // 16-bit elements of a token row per lane: one 8- or 4-byte load
  __shared__ float dir[D];
  __shared__ float red_lo[kWarps], red_hi[kWarps];
  __shared__ int red_start[kWarps];
  __shared__ int hist[kGroupMaxWithinBins];
  __shared__ int base[kGroupMaxWithinBins];
  __shared__ int warp_count[kWarps][kGroupMaxWithinBins];

  const int r = blockIdx.x;
  const int g = blockIdx.y;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int32_t* counts = p.counts + int64_t(g) * p.clusters;

  int before = 0;  // tokens of the clusters before r: where r's range starts
  for (int c = tid; c < r; c += kRefineThreads) before += counts[c];
  for (int off = 16; off > 0; off /= 2) before += __shfl_xor_sync(0xffffffffu, before, off);
  if (lane == 0) red_start[warp] = before;
  const int count = counts[r];
  const bool has_prev = r > 0 && counts[r - 1] > 0;
  const bool has_next = r + 1 < p.clusters && counts[r + 1] > 0;
  const uint16_t* cen = p.centroids + int64_t(g) * p.clusters * D;
  const uint16_t* c_prev = cen + int64_t(has_prev ? r - 1 : r) * D;
  const uint16_t* c_next = cen + int64_t(has_next ? r + 1 : r) * D;
  for (int k = tid; k < D; k += kRefineThreads) {
    dir[k] = __half2float(__ushort_as_half(c_next[k])) - __half2float(__ushort_as_half(c_prev[k]));
  }
  __syncthreads();
  int64_t start = 0;
  for (int w = 0; w < kWarps; ++w) start += red_start[w];
  const int64_t row = int64_t(g) * p.n;
  if (count == 0) return;

  const int b = g / p.heads;
  const int h = g % p.heads;
  const uint16_t* v = static_cast<const uint16_t*>(p.v) + b * p.v_stride[0] + h * p.v_stride[1];
  // the lane's slice of token row i's dot product with the direction
  auto partial_dot = [&](int i) {
    const int64_t t = p.perm_in[row + start + i];
    const uint16_t* x = v + t * p.v_stride[2] + lane * kPerLane;
    if constexpr (kPerLane == 4) {
      const uint2 bits = *reinterpret_cast<const uint2*>(x);  // rows are 16-byte aligned (the binding checks)
      const float2 a = unpack_pair<T>(bits.x), c = unpack_pair<T>(bits.y);
      const float* d = dir + lane * 4;
      return fmaf(c.y, d[3], fmaf(c.x, d[2], fmaf(a.y, d[1], a.x * d[0])));
    } else {
      const float2 a = unpack_pair<T>(*reinterpret_cast<const uint32_t*>(x));
      return fmaf(a.y, dir[lane * 2 + 1], a.x * dir[lane * 2]);
    }
  };
  // kUnroll tokens per warp and trip, their loads issued together: a big cluster's block is often the last one
  // running, and one token at a time would wait a full memory latency per token
  constexpr int kUnroll = 4;
  float lo = INFINITY, hi = -INFINITY;
  for (int i0 = warp; i0 < count; i0 += kUnroll * kWarps) {
    float dot[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dot[u] = i0 + u * kWarps < count ? partial_dot(i0 + u * kWarps) : 0.f;
#pragma unroll
    for (int off = 16; off > 0; off /= 2)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) dot[u] += __shfl_xor_sync(0xffffffffu, dot[u], off);  // equal in every lane
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * kWarps;
      if (i < count) {  // warp-uniform
        if (lane == 0) p.keys[row + start + i] = dot[u];
        lo = fminf(lo, dot[u]);  // fminf / fmaxf drop a NaN key, as the spec does
        hi = fmaxf(hi, dot[u]);
      }
    }
  }
  if (lane == 0) {
    red_lo[warp] = lo;
    red_hi[warp] = hi;
  }
  for (int k = tid; k < kGroupMaxWithinBins; k += kRefineThreads) hist[k] = 0;
  for (int k = tid; k < kWarps * kGroupMaxWithinBins; k += kRefineThreads) (&warp_count[0][0])[k] = 0;
  __syncthreads();  // also makes lane 0's keys visible to the block
  for (int w = 0; w < kWarps; ++w) {
    lo = fminf(lo, red_lo[w]);
    hi = fmaxf(hi, red_hi[w]);
  }
  const float width = hi - lo;
  const bool valid = width > 0.f && width < INFINITY;
  const float scale = valid ? __fdiv_rn(float(p.bins), width) : 0.f;  // 0: every key in bin 0
  const float* keys = p.keys + row + start;
  for (int i = tid; i < count; i += kRefineThreads) atomicAdd(&hist[within_bin(keys[i], lo, scale, p.bins)], 1);
  __syncthreads();
  if (tid == 0) {
    int64_t s = start;
    for (int k = 0; k < p.bins; ++k) {
      base[k] = int(s - start);
      s += hist[k];
    }
  }
  __syncthreads();

  const int32_t* perm_in = p.perm_in + row + start;
  int32_t* perm_out = p.perm_out + row + start;
  for (int i0 = 0; i0 < count; i0 += kRefineThreads) {
    const int i = i0 + tid;
    const bool in_range = i < count;
    const int bin = in_range ? within_bin(keys[i], lo, scale, p.bins) : kGroupMaxWithinBins;  // no real bin
    stable_scatter_step(bin, in_range, warp_count, base, p.bins, [&](int slot) { perm_out[slot] = perm_in[i]; });
  }
}

}  // namespace vc
