// Fused k-means grouping of V-Smooth (the semantics of kernels/reference.py: kmeans_labels,
// labels_to_permutation; chain order of kernels/grouping_order.py). Every (batch, head) group in
// one launch per pass; no host synchronization, no allocation: capturable in a CUDA graph.
//
//   pass:    one read of V per k-means round. A block owns a contiguous range of 64-token tiles of
//            one group. Per tile: tokens -> shared memory (16-bit, exact), float32 distances
//            ||c||^2 - 2 x.c to every centroid (register tile: 4 tokens x 8 centroids per thread,
//            centroids float32 in shared memory), argmin with ties to the lowest id, then either
//            the cluster sums (a thread owns one channel and adds the tile's tokens in token
//            order: deterministic, no atomics) or, in the final round, the labels. For bf16 V the
//            dot products run on tensor cores instead (group_pass_tc_kernel: bf16 MMA with each
//            centroid split into three bf16 terms, float32 accumulate; same argmin). Per-block sums
//            and counts go to a small global buffer; nothing is accumulated across blocks by atomics,
//            so the result does not depend on scheduling.
//   update:  centroid = sum of the block partials / count (partials added in block order); an
//            empty cluster keeps its centroid.
//   order:   one block per group: cluster totals, the greedy nearest-neighbour chain, counts and
//            fp16 centroids in the new ids.
//   permute: per block range of the final pass: labels in the new ids and the stable counting-sort
//            scatter; a block's start offsets come from the final pass's per-block counts, so no
//            separate histogram pass is needed.
//   reuse:   a cached grouping's permutation (the steps after the grouping window): label counts per
//            block range (group_label_counts_kernel), then the permute kernel with the stored labels
//            as the final ids.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "grouping_params.h"

namespace vc {

constexpr int kPassThreads = 128;   // 16 token rows x 8 centroid lanes of the register tile
#ifndef VC_GROUP_ORDER_WARP
#define VC_GROUP_ORDER_WARP 1  // the chain order of <= 64 clusters in one warp (0: the block-wide chain for every count)
#endif
// VC_GROUP_ORDER_GRAM (grouping_params.h, default 1): the one-warp chain reads its dot products from a Gram
// matrix the block computes first (H200, Wan2.1-1.3B with CFG: order kernel 116.5 -> 35.2 us; docs/grouping.md)
constexpr int kOrderThreads = 256;  // >= kGroupMaxClusters: one thread per cluster
constexpr float kUnreached = 3.0e38f;  // grouping_order._UNREACHED: distance to an empty cluster

template <typename T>
__device__ __forceinline__ float2 unpack_pair(uint32_t bits);

template <>
__device__ __forceinline__ float2 unpack_pair<__nv_bfloat16>(uint32_t bits) {
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}

template <>
__device__ __forceinline__ float2 unpack_pair<__half>(uint32_t bits) {
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}

template <typename T>
__device__ __forceinline__ float unpack_one(uint16_t bits) {
  return unpack_pair<T>(uint32_t(bits)).x;
}

// (score, id) a beats (score, id) b: smaller score, or equal score and smaller id; NaN never wins
__device__ __forceinline__ bool beats(float a, int ia, float b, int ib, bool larger) {
  return (larger ? a > b : a < b) || (a == b && ia < ib);
}

__device__ __forceinline__ void warp_best(float& v, int& idx, bool larger) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, offset);
    if (beats(ov, oi, v, idx, larger)) {
      v = ov;
      idx = oi;
    }
  }
}

// Column of element k of row r in the tensor-core pass's unpadded shared rows: 8-element blocks
// XOR-permuted by the row, so the MMA fragment loads of a warp (8 rows x 4 words) and the 16-byte
// row stores hit 32 different banks.
__device__ __forceinline__ int swizzle(int r, int k) { return k ^ ((r & 7) << 3); }

// The end of one tile in both assignment passes (labels of the tile in shared memory): the counts,
// then the cluster sums (a thread owns one channel and adds the tile's tokens in token order, so
// the float sums are deterministic) or, in the final round, the labels.
template <typename T, int D, int Pitch, bool Swizzled>
__device__ __forceinline__ void finish_tile(const GroupParams& p, bool accumulate, int g, int64_t tok0, int valid,
                                            const uint16_t* xs, const int* labels, float* sums, int* counts) {
  const int tid = threadIdx.x;
  if (tid < valid) atomicAdd(&counts[labels[tid]], 1);  // integer adds: order-independent
  if (accumulate) {
    if (tid < D) {
      for (int r = 0; r < valid; ++r) {
        sums[labels[r] * D + tid] += unpack_one<T>(xs[r * Pitch + (Swizzled ? swizzle(r, tid) : tid)]);
      }
    }
  } else if (tid < valid) {
    p.raw_labels[int64_t(g) * p.n + tok0 + tid] = uint8_t(labels[tid]);
  }
}

// A block's cluster sums and counts to its slot of the partial buffers (no atomics across blocks).
template <int D>
__device__ __forceinline__ void write_partials(const GroupParams& p, bool accumulate, int g, int part,
                                               const float* sums, const int* counts) {
  const int clusters = p.clusters;
  const int64_t slot = int64_t(g) * p.parts + part;
  if (accumulate) {
    float* out = p.part_sums + slot * clusters * D;
    for (int i = threadIdx.x; i < clusters * D; i += kPassThreads) out[i] = sums[i];
  }
  for (int c = threadIdx.x; c < clusters; c += kPassThreads) p.part_counts[slot * clusters + c] = counts[c];
}

template <typename T, int D>
__global__ void __launch_bounds__(kPassThreads) group_pass_kernel(const GroupParams p, const bool accumulate) {
  // +4 elements per row: 8-byte aligned rows whose banks differ between the rows a warp reads
  constexpr int kPitchX = D + 4;
  constexpr int kPitchC = D + 4;
  constexpr int kTile = kGroupTileTokens;
  const int clusters = p.clusters;
  const int cp = group_padded_clusters(clusters);

  extern __shared__ __align__(16) unsigned char group_smem[];
  float* cs = reinterpret_cast<float*>(group_smem);
  uint16_t* xs = reinterpret_cast<uint16_t*>(cs + cp * kPitchC);
  float* sums = reinterpret_cast<float*>(xs + kTile * kPitchX);
  float* norms = sums + cp * D;
  int* counts = reinterpret_cast<int*>(norms + cp);
  int* labels = counts + cp;

  const int g = blockIdx.y;
  const int part = blockIdx.x;
  const int b = g / p.heads;
  const int h = g % p.heads;
  const int tid = threadIdx.x;
  const uint16_t* vg = static_cast<const uint16_t*>(p.v) + b * p.v_stride[0] + h * p.v_stride[1];

  const float* cg = p.centroids + int64_t(g) * clusters * D;
  for (int i = tid; i < cp * (D / 4); i += kPassThreads) {
    const int c = i / (D / 4);
    const int k = i % (D / 4) * 4;
    const float4 val = c < clusters ? *reinterpret_cast<const float4*>(cg + c * D + k) : make_float4(0.f, 0.f, 0.f, 0.f);
    *reinterpret_cast<float4*>(cs + c * kPitchC + k) = val;
  }
  for (int i = tid; i < cp * D; i += kPassThreads) sums[i] = 0.f;
  for (int c = tid; c < cp; c += kPassThreads) counts[c] = 0;
  __syncthreads();
  for (int c = tid; c < cp; c += kPassThreads) {
    float norm = 0.f;
    for (int k = 0; k < D; ++k) norm = fmaf(cs[c * kPitchC + k], cs[c * kPitchC + k], norm);
    norms[c] = c < clusters ? norm : INFINITY;  // a padding centroid never wins
  }

  const int64_t tiles = (int64_t(p.n) + kTile - 1) / kTile;
  const int64_t tile_begin = tiles * part / p.parts;
  const int64_t tile_end = tiles * (part + 1) / p.parts;
  const int ty = tid / 8;  // tokens ty*4 .. ty*4+3 of the tile
  const int tx = tid % 8;  // centroids chunk + j*8 + tx, j < 8
  constexpr int kRowChunks = D / 8;  // 16-byte loads per token row

  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t tok0 = tile * kTile;
    const int valid = int(min(int64_t(kTile), int64_t(p.n) - tok0));
    __syncthreads();  // the previous tile is done with xs and labels (and the prologue with cs)
    for (int i = tid; i < kTile * kRowChunks; i += kPassThreads) {
      const int r = i / kRowChunks;
      const int q = i % kRowChunks;
      uint4 val = make_uint4(0u, 0u, 0u, 0u);
      if (r < valid) val = __ldg(reinterpret_cast<const uint4*>(vg + (tok0 + r) * p.v_stride[2] + q * 8));
      uint2* dst = reinterpret_cast<uint2*>(xs + r * kPitchX + q * 8);
      dst[0] = make_uint2(val.x, val.y);
      dst[1] = make_uint2(val.z, val.w);
    }
    __syncthreads();

    float best[4];
    int best_c[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      best[i] = INFINITY;
      best_c[i] = 0;
    }
    for (int chunk = 0; chunk < cp; chunk += kGroupChunk) {
      float acc[4][8];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
#pragma unroll 2
      for (int k = 0; k < D; k += 4) {
        float xv[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint2 bits = *reinterpret_cast<const uint2*>(xs + (ty * 4 + i) * kPitchX + k);
          const float2 lo = unpack_pair<T>(bits.x);
          const float2 hi = unpack_pair<T>(bits.y);
          xv[i][0] = lo.x;
          xv[i][1] = lo.y;
          xv[i][2] = hi.x;
          xv[i][3] = hi.y;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float4 cv = *reinterpret_cast<const float4*>(cs + (chunk + j * 8 + tx) * kPitchC + k);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[i][j] = fmaf(xv[i][0], cv.x, acc[i][j]);
            acc[i][j] = fmaf(xv[i][1], cv.y, acc[i][j]);
            acc[i][j] = fmaf(xv[i][2], cv.z, acc[i][j]);
            acc[i][j] = fmaf(xv[i][3], cv.w, acc[i][j]);
          }
        }
      }
      // this thread's centroids in increasing id: a strict < keeps the lowest id of a tie
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = chunk + j * 8 + tx;
        const float norm = norms[c];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float score = norm - 2.f * acc[i][j];
          if (score < best[i]) {
            best[i] = score;
            best_c[i] = c;
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int offset = 1; offset < 8; offset <<= 1) {  // the 8 lanes of one token row
        const float os = __shfl_xor_sync(0xffffffffu, best[i], offset);
        const int oc = __shfl_xor_sync(0xffffffffu, best_c[i], offset);
        if (beats(os, oc, best[i], best_c[i], false)) {
          best[i] = os;
          best_c[i] = oc;
        }
      }
      if (tx == 0) labels[ty * 4 + i] = best_c[i];
    }
    __syncthreads();
    finish_tile<T, D, kPitchX, false>(p, accumulate, g, tok0, valid, xs, labels, sums, counts);
  }
  __syncthreads();
  write_partials<D>(p, accumulate, g, part, sums, counts);
}

// D(16x8) += A(16x16) B(16x8), bf16 in, float32 accumulate; fragments as in the PTX ISA's
// mma.m16n8k16 layout (lane = 4 * row group + thread in group).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t load_pair(const uint16_t* at) { return *reinterpret_cast<const uint32_t*>(at); }

// The assignment pass of group_pass_kernel for bf16 V with the dot products x.c on tensor cores.
// Tokens are exact in bf16; each float32 centroid is split into kGroupSplits bf16 terms whose sum is
// the centroid to float32 precision, so x.c = sum over terms of x.c_term, every product exact and
// accumulated in float32 by the MMA. ||c||^2 and the argmin are float32, as in the FP32 pass.
// Warp w owns tokens 16w..16w+15 of a tile: A = the tokens, B = 8 centroids per MMA.
template <int D>
__global__ void __launch_bounds__(kPassThreads) group_pass_tc_kernel(const GroupParams p, const bool accumulate) {
  constexpr int kTile = kGroupTileTokens;
  static_assert(kPassThreads / 32 * 16 == kTile, "each warp owns 16 tokens of the tile");
  const int clusters = p.clusters;
  const int cp = group_padded_clusters(clusters);

  extern __shared__ __align__(16) unsigned char group_smem[];
  uint16_t* cs = reinterpret_cast<uint16_t*>(group_smem);  // [kGroupSplits][cp][D] bf16 terms, swizzled
  uint16_t* xs = cs + kGroupSplits * cp * D;               // [kTile][D], swizzled
  float* sums = reinterpret_cast<float*>(xs + kTile * D);
  float* norms = sums + cp * D;
  int* counts = reinterpret_cast<int*>(norms + cp);
  int* labels = counts + cp;

  const int g = blockIdx.y;
  const int part = blockIdx.x;
  const int b = g / p.heads;
  const int h = g % p.heads;
  const int tid = threadIdx.x;
  const uint16_t* vg = static_cast<const uint16_t*>(p.v) + b * p.v_stride[0] + h * p.v_stride[1];

  const float* cg = p.centroids + int64_t(g) * clusters * D;
  for (int i = tid; i < cp * D; i += kPassThreads) {
    const int c = i / D;
    const int k = i % D;
    float rest = c < clusters ? cg[c * D + k] : 0.f;
#pragma unroll
    for (int s = 0; s < kGroupSplits; ++s) {  // rest - term is exact: the terms carry disjoint bits
      const __nv_bfloat16 term = __float2bfloat16_rn(rest);
      cs[(s * cp + c) * D + swizzle(c, k)] = __bfloat16_as_ushort(term);
      rest -= __bfloat162float(term);
    }
  }
  for (int i = tid; i < cp * D; i += kPassThreads) sums[i] = 0.f;
  for (int c = tid; c < cp; c += kPassThreads) counts[c] = 0;
  const int warp = tid / 32;
  const int lane = tid % 32;
  for (int c = warp; c < cp; c += kPassThreads / 32) {  // a warp per centroid: coalesced reads
    float norm = 0.f;
    if (c < clusters) {
      for (int k = lane; k < D; k += 32) norm = fmaf(cg[c * D + k], cg[c * D + k], norm);
      for (int offset = 16; offset > 0; offset >>= 1) norm += __shfl_xor_sync(0xffffffffu, norm, offset);
    }
    if (lane == 0) norms[c] = c < clusters ? norm : INFINITY;  // a padding centroid never wins
  }

  const int64_t tiles = (int64_t(p.n) + kTile - 1) / kTile;
  const int64_t tile_begin = tiles * part / p.parts;
  const int64_t tile_end = tiles * (part + 1) / p.parts;
  const int row = lane / 4;  // tokens 16*warp + row and + row + 8 of the tile
  const int quad = lane % 4;  // k pair 2*quad (+8) of each 16-wide step; centroids 2*quad, +1 of each 8
  constexpr int kRowChunks = D / 8;

  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t tok0 = tile * kTile;
    const int valid = int(min(int64_t(kTile), int64_t(p.n) - tok0));
    __syncthreads();  // the previous tile is done with xs and labels (and the prologue with cs)
    for (int i = tid; i < kTile * kRowChunks; i += kPassThreads) {
      const int r = i / kRowChunks;
      const int q = i % kRowChunks;
      uint4 val = make_uint4(0u, 0u, 0u, 0u);
      if (r < valid) val = __ldg(reinterpret_cast<const uint4*>(vg + (tok0 + r) * p.v_stride[2] + q * 8));
      *reinterpret_cast<uint4*>(xs + r * D + swizzle(r, q * 8)) = val;
    }
    __syncthreads();

    // rows 16*warp + row (+ 8) of xs and centroids chunk + 8j + row all have row % 8 == row: one swizzle
    const uint16_t* xa = xs + (warp * 16 + row) * D;
    float best[2] = {INFINITY, INFINITY};
    int best_c[2] = {0, 0};
    for (int chunk = 0; chunk < cp; chunk += kGroupChunk) {
      float acc[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
#pragma unroll 2
      for (int k = 0; k < D; k += 16) {
        const int lo = swizzle(row, k + 2 * quad);
        const int hi = swizzle(row, k + 8 + 2 * quad);
        const uint32_t a[4] = {load_pair(xa + lo), load_pair(xa + 8 * D + lo), load_pair(xa + hi), load_pair(xa + 8 * D + hi)};
#pragma unroll
        for (int s = kGroupSplits - 1; s >= 0; --s) {  // smallest terms first
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const uint16_t* cb = cs + (s * cp + chunk + j * 8 + row) * D;
            mma_bf16_16816(acc[j], a, load_pair(cb + lo), load_pair(cb + hi));
          }
        }
      }
      // this lane's centroids in increasing id: a strict < keeps the lowest id of a tie
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = chunk + j * 8 + 2 * quad + e;
          const float norm = norms[c];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const float score = norm - 2.f * acc[j][half * 2 + e];
            if (score < best[half]) {
              best[half] = score;
              best_c[half] = c;
            }
          }
        }
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int offset = 1; offset < 4; offset <<= 1) {  // the 4 lanes of one token row
        const float os = __shfl_xor_sync(0xffffffffu, best[half], offset);
        const int oc = __shfl_xor_sync(0xffffffffu, best_c[half], offset);
        if (beats(os, oc, best[half], best_c[half], false)) {
          best[half] = os;
          best_c[half] = oc;
        }
      }
      if (quad == 0) labels[warp * 16 + row + half * 8] = best_c[half];
    }
    __syncthreads();
    finish_tile<__nv_bfloat16, D, D, true>(p, accumulate, g, tok0, valid, xs, labels, sums, counts);
  }
  __syncthreads();
  write_partials<D>(p, accumulate, g, part, sums, counts);
}

__global__ void group_update_kernel(const GroupParams p) {
  const int g = blockIdx.y;
  const int64_t size = int64_t(p.clusters) * p.head_dim;
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= size) return;
  const int c = int(e / p.head_dim);
  float sum = 0.f;
  int count = 0;
  for (int part = 0; part < p.parts; ++part) {
    const int64_t slot = int64_t(g) * p.parts + part;
    sum += p.part_sums[slot * size + e];
    count += p.part_counts[slot * p.clusters + c];
  }
  if (count > 0) p.centroids[int64_t(g) * size + e] = sum / float(count);
}

// Block-wide best (score, id) over one value per thread; every thread gets the winning id.
__device__ __forceinline__ int block_best(float v, int idx, bool larger, float* red_val, int* red_idx) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  warp_best(v, idx, larger);
  if (lane == 0) {
    red_val[warp] = v;
    red_idx[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    const bool has = lane < kOrderThreads / 32;
    v = has ? red_val[lane] : (larger ? -INFINITY : INFINITY);
    idx = has ? red_idx[lane] : 0x7fffffff;
    warp_best(v, idx, larger);
    if (lane == 0) red_idx[kOrderThreads / 32] = idx;
  }
  __syncthreads();
  return red_idx[kOrderThreads / 32];
}

__global__ void __launch_bounds__(kOrderThreads) group_order_kernel(const GroupParams p, const bool chain) {
  const int clusters = p.clusters;
  const int d = p.head_dim;
  const int pitch = d + 1;  // thread c reads row c: consecutive rows fall in different banks
  extern __shared__ __align__(16) unsigned char order_smem[];
  float* cen = reinterpret_cast<float*>(order_smem);
  float* norms = cen + clusters * pitch;
  float* spread = norms + clusters;
  int* total = reinterpret_cast<int*>(spread + clusters);
  int* rank = total + clusters;
  float* mean = reinterpret_cast<float*>(rank + clusters);
  float* red_val = mean + d;
  int* red_idx = reinterpret_cast<int*>(red_val + 32);

  const int g = blockIdx.x;
  const int tid = threadIdx.x;
  const float* cg = p.centroids + int64_t(g) * clusters * d;
  for (int i = tid; i < clusters * d; i += kOrderThreads) cen[i / d * pitch + i % d] = cg[i];
  if (tid < clusters) {
    int count = 0;
    for (int part = 0; part < p.parts; ++part) count += p.part_counts[(int64_t(g) * p.parts + part) * clusters + tid];
    total[tid] = count;
    rank[tid] = tid;
  }
  __syncthreads();

  if (chain) {
    // start: the non-empty cluster farthest from the count-weighted mean (first on ties)
    for (int k = tid; k < d; k += kOrderThreads) {
      float s = 0.f;
      float w = 0.f;
      for (int c = 0; c < clusters; ++c) {
        s = fmaf(cen[c * pitch + k], float(total[c]), s);
        w += float(total[c]);
      }
      mean[k] = s / fmaxf(w, 1.f);
    }
    __syncthreads();
    float my_spread = -INFINITY;
    if (tid < clusters) {
      float s = 0.f;
      float nn = 0.f;
      for (int k = 0; k < d; ++k) {
        const float x = cen[tid * pitch + k];
        s = fmaf(x - mean[k], x - mean[k], s);
        nn = fmaf(x, x, nn);
      }
      norms[tid] = nn;
      my_spread = total[tid] > 0 ? s : -1.f;
    }
    int current = block_best(my_spread, tid < clusters ? tid : 0x7fffffff, true, red_val, red_idx);
    if (tid == current) rank[tid] = 0;
    if (VC_GROUP_ORDER_WARP && clusters <= 64) {
      // The chain in one warp (the node's 64 clusters): lane l owns clusters l and l + 32, each step's
      // argmin is a warp shuffle tree with no block barrier (the block-wide version below spends most of
      // its 142 us on 63 pairs of barriers). The same dot products in the same order and the same
      // (distance, id) order: the same chain, up to NaN distances, whose winner may depend on the tree.
#if VC_GROUP_ORDER_GRAM
      // Every pairwise dot product once, by the whole block (a 4 x 4 tile of the 64 x 64 Gram matrix per
      // thread), in the chain's own order: element k into accumulator k % 4, combined (0 + 1) + (2 + 3).
      // fmaf(a, b, s) == fmaf(b, a, s), so gram[x][y] is bit for bit the dot the chain took from x to y and
      // the warp below is left with two shared loads and a shuffle tree per step (one warp issuing 256
      // dependent FMAs a step was the 117 us of the chain without it: docs/grouping.md).
      float* gram = reinterpret_cast<float*>(red_idx + 32);
      {
        const int ta = 4 * (tid / 16), tb = 4 * (tid % 16);
        if (ta < clusters && tb < clusters) {
          int ra[4], rb[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            ra[i] = min(ta + i, clusters - 1) * pitch;  // rows past the clusters read a real row, never stored
            rb[i] = min(tb + i, clusters - 1) * pitch;
          }
          float acc[4][4][4] = {};
          for (int k = 0; k < d; k += 4) {
#pragma unroll
            for (int u = 0; u < 4; ++u) {
              float a[4], b[4];
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                a[i] = cen[ra[i] + k + u];
                b[i] = cen[rb[i] + k + u];
              }
#pragma unroll
              for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j][u] = fmaf(a[i], b[j], acc[i][j][u]);
            }
          }
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
              if (ta + i < clusters && tb + j < clusters)
                gram[(ta + i) * 64 + tb + j] = (acc[i][j][0] + acc[i][j][1]) + (acc[i][j][2] + acc[i][j][3]);
        }
      }
      __syncthreads();
#endif
      if (tid < 32) {
        bool seen[2] = {tid == current, tid + 32 == current};
        for (int step = 1; step < clusters; ++step) {
          float best = INFINITY;
          int best_id = 0x7fffffff;
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            const int c = tid + 32 * m;
            float dist = INFINITY;
            if (c < clusters && !seen[m]) {
              if (total[c] > 0) {
#if VC_GROUP_ORDER_GRAM
                dist = (norms[current] + norms[c]) - 2.f * gram[current * 64 + c];
#else
                float dot[4] = {0.f, 0.f, 0.f, 0.f};
                for (int k = 0; k < d; k += 4) {
#pragma unroll
                  for (int u = 0; u < 4; ++u) dot[u] = fmaf(cen[current * pitch + k + u], cen[c * pitch + k + u], dot[u]);
                }
                dist = (norms[current] + norms[c]) - 2.f * ((dot[0] + dot[1]) + (dot[2] + dot[3]));
#endif
              } else {
                dist = kUnreached;
              }
            }
            const int id = c < clusters ? c : 0x7fffffff;
            if (beats(dist, id, best, best_id, false)) {
              best = dist;
              best_id = id;
            }
          }
          warp_best(best, best_id, false);
          current = best_id;
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            if (tid + 32 * m == current) {
              seen[m] = true;
              rank[current] = step;
            }
          }
        }
      }
      __syncthreads();
    } else {
      // The chain with one block-wide argmin per step: a cluster's dot product has four accumulators
      // (element k into accumulator k % 4, combined (0 + 1) + (2 + 3)); with 64 clusters or fewer four
      // adjacent threads take one accumulator each, with 128 or fewer two take two, so a step waits for
      // 32 or 64 dependent FMAs instead of 128 (the same sums in the same order: the same bits; measured
      // 164 -> 142 us at Wan2.1-1.3B with CFG, docs/grouping.md).
      const int per_cluster = clusters <= kOrderThreads / 4 ? 4 : (clusters <= kOrderThreads / 2 ? 2 : 1);
      const int mine = tid / per_cluster, part = tid % per_cluster;
      const bool lead = part == 0 && mine < clusters;  // the thread that reports the cluster's distance
      bool visited = mine == current;
      for (int step = 1; step < clusters; ++step) {
        const bool active = mine < clusters && !visited && total[mine] > 0;
        float dot[4] = {0.f, 0.f, 0.f, 0.f};  // this thread's accumulators (the others stay 0)
        if (active && per_cluster == 1) {
          for (int k = 0; k < d; k += 4) {
#pragma unroll
            for (int u = 0; u < 4; ++u) dot[u] = fmaf(cen[current * pitch + k + u], cen[mine * pitch + k + u], dot[u]);
          }
        } else if (active) {
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            if (u % per_cluster != part) continue;
            for (int k = u; k < d; k += 4) dot[u] = fmaf(cen[current * pitch + k], cen[mine * pitch + k], dot[u]);
          }
        }
        // the lead thread gathers (dot0 + dot1) + (dot2 + dot3) from its neighbours (every lane shuffles)
        float total_dot = (dot[0] + dot[1]) + (dot[2] + dot[3]);  // per_cluster 4: exactly dot[part]
        if (per_cluster == 4) {
          const float pair = total_dot + __shfl_down_sync(0xffffffffu, total_dot, 1);  // parts 0, 2: 0 + 1, 2 + 3
          total_dot = pair + __shfl_down_sync(0xffffffffu, pair, 2);
        } else if (per_cluster == 2) {
          const float a = dot[0] + __shfl_down_sync(0xffffffffu, dot[1], 1);
          const float b = dot[2] + __shfl_down_sync(0xffffffffu, dot[3], 1);
          total_dot = a + b;
        }
        float dist = INFINITY;
        if (lead && !visited) dist = total[mine] > 0 ? (norms[current] + norms[mine]) - 2.f * total_dot : kUnreached;
        current = block_best(dist, lead ? mine : 0x7fffffff, false, red_val, red_idx);
        if (mine == current) {
          visited = true;
          if (part == 0) rank[mine] = step;
        }
      }
      __syncthreads();
    }
  }

  if (tid < clusters) {
    p.rank[int64_t(g) * clusters + tid] = rank[tid];
    p.counts[int64_t(g) * clusters + rank[tid]] = total[tid];
  }
  for (int i = tid; i < clusters * d; i += kOrderThreads) {
    const int c = i / d;
    const float x = cen[c * pitch + i % d];
    const float clamped = x != x ? x : fminf(fmaxf(x, -65504.f), 65504.f);  // as torch clamp: NaN stays
    p.centroids_out[(int64_t(g) * clusters + rank[c]) * d + i % d] = __half_as_ushort(__float2half_rn(clamped));
  }
}

// One step of a block's stable counting-sort scatter (kPermThreads threads, one item each, in slot order): the
// slot of this thread's item is base[key] + the same-key items before it (in its warp by __match_any_sync, in the
// warps before by their counts); write(slot) stores it; then base[] advances past the step's items. Valid keys are
// < `keys`; an invalid item's key is any value no valid item has (it is matched, never indexed). Integer counts
// only: deterministic. Block-wide: every thread of the block calls it the same number of times.
template <int kKeys, typename Write>
__device__ __forceinline__ void stable_scatter_step(int key, bool valid, int (&warp_count)[kPermThreads / 32][kKeys],
                                                    int (&base)[kKeys], int keys, Write write) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const unsigned peers = __match_any_sync(0xffffffffu, key);
  const int before = __popc(peers & ((1u << lane) - 1u));  // same-key items earlier in this warp
  if (valid && before == 0) warp_count[warp][key] = __popc(peers);
  __syncthreads();
  if (valid) {
    int slot = base[key] + before;
    for (int w = 0; w < warp; ++w) slot += warp_count[w][key];
    write(slot);
  }
  __syncthreads();
  if (tid < keys) {
    int added = 0;
    for (int w = 0; w < kPermThreads / 32; ++w) {
      added += warp_count[w][tid];
      warp_count[w][tid] = 0;
    }
    base[tid] += added;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kPermThreads) group_permute_kernel(const GroupParams p) {
  constexpr int kWarps = kPermThreads / 32;
  __shared__ int warp_count[kWarps][kGroupMaxClusters];
  __shared__ int base[kGroupMaxClusters];   // next slot of each k-means cluster in this block's range
  __shared__ int start[kGroupMaxClusters];  // first slot of each new id
  __shared__ int total_new[kGroupMaxClusters];
  __shared__ int rank[kGroupMaxClusters];

  const int clusters = p.clusters;
  const int g = blockIdx.y;
  const int part = blockIdx.x;
  const int tid = threadIdx.x;
  int prior = 0;  // tokens of cluster tid in the ranges before this block's
  if (tid < clusters) {
    int total = 0;
    for (int q = 0; q < p.parts; ++q) {
      const int count = p.part_counts[(int64_t(g) * p.parts + q) * clusters + tid];
      total += count;
      if (q < part) prior += count;
    }
    rank[tid] = p.rank != nullptr ? p.rank[int64_t(g) * clusters + tid] : tid;  // no rank: labels already ordered
    total_new[rank[tid]] = total;
  }
  for (int i = tid; i < kWarps * kGroupMaxClusters; i += kPermThreads) (&warp_count[0][0])[i] = 0;
  __syncthreads();
  if (tid < clusters) {
    int s = 0;
    for (int l = 0; l < tid; ++l) s += total_new[l];
    start[tid] = s;
  }
  __syncthreads();
  if (tid < clusters) base[tid] = start[rank[tid]] + prior;
  __syncthreads();

  const int64_t tiles = (int64_t(p.n) + kGroupTileTokens - 1) / kGroupTileTokens;
  const int64_t tok_begin = tiles * part / p.parts * kGroupTileTokens;
  const int64_t tok_end = min(int64_t(p.n), tiles * (part + 1) / p.parts * kGroupTileTokens);
  const uint8_t* raw_labels = p.raw_labels + int64_t(g) * p.n;
  for (int64_t t0 = tok_begin; t0 < tok_end; t0 += kPermThreads) {
    const int64_t t = t0 + tid;
    const bool valid = t < tok_end;
    const int raw = valid ? int(raw_labels[t]) : kGroupMaxClusters;  // a key no real label has
    stable_scatter_step(raw, valid, warp_count, base, clusters, [&](int slot) {
      p.perm[int64_t(g) * p.n + slot] = int32_t(t);
      if (p.labels != nullptr) p.labels[int64_t(g) * p.n + t] = uint8_t(rank[raw]);
    });
  }
}

// Per-part cluster counts of stored labels (a cached grouping's reuse): the same token ranges as the
// assignment pass's parts, so group_permute_kernel (rank == nullptr, labels == nullptr) turns them
// into the stable permutation with no sort. Integer shared-memory adds: deterministic.
__global__ void __launch_bounds__(kPermThreads) group_label_counts_kernel(const GroupParams p) {
  __shared__ int hist[kGroupMaxClusters];
  const int g = blockIdx.y;
  const int part = blockIdx.x;
  const int tid = threadIdx.x;
  for (int c = tid; c < kGroupMaxClusters; c += kPermThreads) hist[c] = 0;
  __syncthreads();
  const int64_t tiles = (int64_t(p.n) + kGroupTileTokens - 1) / kGroupTileTokens;
  const int64_t tok_begin = tiles * part / p.parts * kGroupTileTokens;
  const int64_t tok_end = min(int64_t(p.n), tiles * (part + 1) / p.parts * kGroupTileTokens);
  const uint8_t* labels = p.raw_labels + int64_t(g) * p.n;
  // tok_begin is a multiple of 64 and each head's row starts 16-byte aligned when n % 16 == 0; the
  // byte loop keeps any n correct (the labels are 1 byte a token: this pass reads 32 KB a head)
  for (int64_t t = tok_begin + tid; t < tok_end; t += kPermThreads) atomicAdd(&hist[labels[t]], 1);
  __syncthreads();
  for (int c = tid; c < p.clusters; c += kPermThreads) p.part_counts[(int64_t(g) * p.parts + part) * p.clusters + c] = hist[c];
}

}  // namespace vc
