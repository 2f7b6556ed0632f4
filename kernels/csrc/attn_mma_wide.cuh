// Portable VC-Attention forward kernel in the FlashAttention-2 layout (built with -DVC_MMA_WIDE=1).
//
// Same numerics and operand contract as attn_mma.cuh (read its header first); what changes is the
// work split, because the 16-rows-per-warp kernel is latency-bound (docs/kernel-notes.md sec. 6):
// - One CTA = 128 query rows, 4 warps x 32 rows. Each warp runs two m16 MMA
//   chains (rows 0-15 and 16-31 of its slice) that share every K and V fragment read by ldmatrix:
//   half the shared-memory reads per MMA, and two independent accumulator chains per warp.
// - Keys stream in 64-key chunks through a VC_MMA_STAGES-deep cp.async ring (one barrier per
//   chunk). A chunk is half a 128-key scale tile; the K scale and the V-Smooth mean are the tile's.
// - Online softmax per 64-key chunk: the running max M moves at most once per chunk instead of
//   once per 128-key tile. Where M rises inside a tile, the first half was encoded against a smaller
//   M, not the tile's max (reference.quantize_p with offset_block=64 is the exact emulation).
// - Q fragments stay in registers for D=64; for D=128 they are re-read from shared memory every
//   chunk (8 ldmatrix per warp per chunk): O (128) and S (64) already put D=128 at the 255-register
//   cap (ptxas -v per arch in docs/kernel-notes.md sec. 10).
// P's argument, its encoding and the rescale are attn_mma.cuh's p_row / p_arg / encode_p / rescale
// (one definition for both layouts).
#pragma once
#include "attn_mma.cuh"

namespace vc {

#ifndef VC_MMA_STAGES
#define VC_MMA_STAGES 2
#endif
constexpr int kWideStages = VC_MMA_STAGES;
static_assert(kWideStages >= 2 && kWideStages <= 4, "VC_MMA_STAGES must be 2, 3 or 4");

constexpr int kWideChains = 2;                           // m16 row blocks per warp
constexpr int kWideRowsPerWarp = 16 * kWideChains;       // 32
constexpr int kWideRows = kAttnWarps * kWideRowsPerWarp;  // 128 query rows per CTA
constexpr int kChunkKeys = 64;                           // keys per stage and per softmax step
constexpr int kChunksPerTile = kKBlock / kChunkKeys;

// 50 KB for D=128 with 2 stages: two CTAs fit the 100 KB of an Ada / consumer-Blackwell SM.
template <int D>
struct WideSmem {
  static constexpr int kQ = kWideRows * D;    // Q tile, bytes
  static constexpr int kK = kChunkKeys * D;   // one K chunk
  static constexpr int kV = D * kChunkKeys;   // one transposed V chunk (D rows of 64 keys)
  static constexpr int kMean = D * 2;         // the chunk's tile mean, fp16
  static constexpr int kOffK = kQ;
  static constexpr int kOffV = kOffK + kWideStages * kK;
  static constexpr int kOffMean = kOffV + kWideStages * kV;
  static constexpr int kOffInvScale = kOffMean + kWideStages * kMean;
  static constexpr int kBytes = kOffInvScale + D * 4;
};

// Copies a [kRows x kRowBytes] tile (global rows `src_stride` bytes apart) into swizzled shared
// memory. Each thread copies a run of consecutive 16-byte chunks of ONE row, so its addresses are
// one global pointer and one shared offset plus immediates: the loop-invariant per-copy 64-bit
// addresses of load_tile_async's strided split cost registers the wide kernel does not have.
template <int kRowBytes, int kRows, bool kKeyRows = false>
__device__ __forceinline__ void load_rows_async(uint32_t dst, const uint8_t* src, int64_t src_stride) {
  constexpr int kChunksPerRow = kRowBytes / 16;
  constexpr int kRun = kRows * kChunksPerRow / kAttnThreads;  // chunks per thread
  static_assert(kRun >= 1 && kChunksPerRow % kRun == 0, "each thread copies whole runs within one row");
  constexpr int kThreadsPerRow = kChunksPerRow / kRun;
  const int row = threadIdx.x / kThreadsPerRow, first = (threadIdx.x % kThreadsPerRow) * kRun;
  const uint8_t* row_src = src + row * src_stride + first * 16;
#pragma unroll
  for (int c = 0; c < kRun; ++c) cp_async_16(dst + swizzled<kRowBytes, kKeyRows>(row, first + c), row_src + c * 16);
}

template <int D, bool kQkFp8, bool kExpCast, bool kVSmooth>
struct AttnMmaWide {
  static constexpr int kKSteps = D / 32;             // MMA k-steps over the head dim (QK)
  static constexpr int kKeyTiles = kChunkKeys / 8;   // n-tiles of S per chunk
  static constexpr int kDimTiles = D / 8;            // n-tiles of O
  static constexpr int kPSteps = kChunkKeys / 32;    // MMA k-steps over keys (PV) per chunk
  static constexpr bool kQInRegs = D == 64;
  using Smem = WideSmem<D>;
  using SAcc = std::conditional_t<kQkFp8, float, int>;
  using Encoder = AttnMma<D, kQkFp8, kExpCast, kVSmooth>;

  // per-thread online-softmax state: chain c, rows g and g+8 of that chain's 16
  float acc[kWideChains][kDimTiles][4];
  float row_offset[kWideChains][2];  // M, the running max of the scaled scores (-inf before the first chunk)
  float row_sum[kWideChains][2];
  uint32_t q_frag[kQInRegs ? kWideChains : 1][kQInRegs ? kKSteps : 1][4];

  __device__ __forceinline__ void run(const AttnParams& p, uint8_t* smem) {
    const int bh = blockIdx.y;
    const int q_row0 = blockIdx.x * kWideRows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int warp_row0 = warp * kWideRowsPerWarp;
    const int n_tiles = p.n_pad / kKBlock;
    const int n_chunks = (p.n + kChunkKeys - 1) / kChunkKeys;  // chunks past the last key are skipped
    const uint32_t sbase = smem_addr(smem);
    const uint8_t* q_src = static_cast<const uint8_t*>(p.q_q) + (int64_t(bh) * p.n_pad + q_row0) * D;
    const uint8_t* k_src = static_cast<const uint8_t*>(p.k_q) + int64_t(bh) * p.n_pad * D;
    const uint8_t* v_src = p.v_t + int64_t(bh) * D * p.n_pad;
    const uint8_t* mean_src = reinterpret_cast<const uint8_t*>(p.v_mean) + int64_t(bh) * n_tiles * D * 2;
    float* inv_scale = reinterpret_cast<float*>(smem + Smem::kOffInvScale);

    auto load_chunk = [&](int chunk) {
      const int stage = chunk % kWideStages;
      load_rows_async<D, kChunkKeys, true>(sbase + Smem::kOffK + stage * Smem::kK, k_src + int64_t(chunk) * kChunkKeys * D, D);
      load_rows_async<kChunkKeys, D>(sbase + Smem::kOffV + stage * Smem::kV, v_src + int64_t(chunk) * kChunkKeys, p.n_pad);
      if constexpr (kVSmooth) {
        if (threadIdx.x < Smem::kMean / 16)
          cp_async_16(sbase + Smem::kOffMean + stage * Smem::kMean + threadIdx.x * 16,
                      mean_src + int64_t(chunk / kChunksPerTile) * Smem::kMean + threadIdx.x * 16);
      }
    };

    // prologue: Q and the first kWideStages-1 chunks, one commit group per chunk (Q rides in the first)
    load_rows_async<D, kWideRows>(sbase, q_src, D);
#pragma unroll
    for (int c = 0; c < kWideStages - 1; ++c) {
      if (c < n_chunks) load_chunk(c);
      cp_async_commit();
    }
    if constexpr (kVSmooth) {
      for (int c = threadIdx.x; c < D; c += kAttnThreads) inv_scale[c] = 1.0f / p.v_scale[int64_t(bh) * D + c];
    }
#pragma unroll
    for (int c = 0; c < kWideChains; ++c) {
#pragma unroll
      for (int i = 0; i < kDimTiles; ++i) acc[c][i][0] = acc[c][i][1] = acc[c][i][2] = acc[c][i][3] = 0.0f;
      row_offset[c][0] = row_offset[c][1] = -INFINITY;
      row_sum[c][0] = row_sum[c][1] = 0.0f;
    }
    // the scales of this thread's rows g and g+8 of each chain (rows < n_pad; padded rows have 0)
    const float* q_sc_rows = p.q_scale + int64_t(bh) * p.n_pad + q_row0 + warp_row0 + (lane >> 2);
    float q_scale[kWideChains][2];
#pragma unroll
    for (int c = 0; c < kWideChains; ++c) {
      q_scale[c][0] = q_sc_rows[16 * c];
      q_scale[c][1] = q_sc_rows[16 * c + 8];
    }

    for (int chunk = 0; chunk < n_chunks; ++chunk) {
      cp_async_wait<kWideStages - 2>();
      // chunk's data visible to all warps, and every warp is done with the stage refilled below
      __syncthreads();
      const int next = chunk + kWideStages - 1;
      if (next < n_chunks) load_chunk(next);
      cp_async_commit();
      if constexpr (kQInRegs) {
        if (chunk == 0) load_q_fragments(sbase, warp_row0, lane);
      }
      const float k_scale = p.k_scale[int64_t(bh) * n_tiles + chunk / kChunksPerTile];
      float scale[kWideChains][2];
#pragma unroll
      for (int c = 0; c < kWideChains; ++c) {
        scale[c][0] = q_scale[c][0] * k_scale;
        scale[c][1] = q_scale[c][1] * k_scale;
      }
      const int valid = p.n - chunk * kChunkKeys;  // keys of this chunk that are real (> 0)
      if (valid < kChunkKeys) {
        process_chunk<true>(sbase, chunk % kWideStages, scale, valid, warp_row0, lane, smem);
      } else {
        process_chunk<false>(sbase, chunk % kWideStages, scale, kChunkKeys, warp_row0, lane, smem);
      }
    }
    store_output(p, bh, q_row0 + warp_row0, lane);
  }

  __device__ __forceinline__ void q_fragment(uint32_t (&a)[4], uint32_t sbase, int warp_row0, int chain, int ks, int lane) const {
    const int matrix = lane >> 3, r = lane & 7;
    ldmatrix_x4(a, sbase + swizzled<D>(warp_row0 + 16 * chain + (matrix & 1) * 8 + r, 2 * ks + (matrix >> 1)));
  }

  __device__ __forceinline__ void load_q_fragments(uint32_t sbase, int warp_row0, int lane) {
#pragma unroll
    for (int c = 0; c < kWideChains; ++c)
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) q_fragment(q_frag[c][ks], sbase, warp_row0, c, ks, lane);
  }

  // one 64-key chunk in ring stage `stage`; its first `valid` keys are real
  template <bool kMask>
  __device__ __forceinline__ void process_chunk(uint32_t sbase, int stage, const float (&scale)[kWideChains][2], int valid,
                                                int warp_row0, int lane, uint8_t* smem) {
    const int t = lane & 3, matrix = lane >> 3, r = lane & 7;
    // ---- S = Q K^T for both chains; k-step outer so consecutive MMAs are independent
    SAcc s[kWideChains][kKeyTiles][4];
#pragma unroll
    for (int c = 0; c < kWideChains; ++c)
#pragma unroll
      for (int i = 0; i < kKeyTiles; ++i) s[c][i][0] = s[c][i][1] = s[c][i][2] = s[c][i][3] = SAcc(0);
    const uint32_t k_base = sbase + Smem::kOffK + stage * Smem::kK;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t a[kWideChains][4];
#pragma unroll
      for (int c = 0; c < kWideChains; ++c) {
        if constexpr (kQInRegs) {
#pragma unroll
          for (int j = 0; j < 4; ++j) a[c][j] = q_frag[c][ks][j];
        } else {
          q_fragment(a[c], sbase, warp_row0, c, ks, lane);
        }
      }
#pragma unroll
      for (int pair = 0; pair < kKeyTiles / 2; ++pair) {
        const int key = 16 * pair + 4 * (r >> 1) + 2 * (matrix >> 1) + (r & 1);
        uint32_t b[4];
        ldmatrix_x4(b, k_base + swizzled<D, true>(key, 2 * ks + (matrix & 1)));
#pragma unroll
        for (int c = 0; c < kWideChains; ++c) {
          if constexpr (kQkFp8) {
            mma_e4m3(s[c][2 * pair], a[c], b[0], b[1]);
            mma_e4m3(s[c][2 * pair + 1], a[c], b[2], b[3]);
          } else {
            mma_s8(s[c][2 * pair], a[c], b[0], b[1]);
            mma_s8(s[c][2 * pair + 1], a[c], b[2], b[3]);
          }
        }
      }
    }
    // key index (within the chunk) of accumulator element e of n-tile i for this thread
    auto key_of = [&](int i, int e) { return 16 * (i >> 1) + 4 * t + 2 * (i & 1) + (e & 1); };

    // ---- row max -> new running offset per chain and row (max of raw scores; scale >= 0)
    float alpha[kWideChains][2];
    vc_p::ExpCastRow prow[kWideChains][2];
#pragma unroll
    for (int c = 0; c < kWideChains; ++c) {
      float tile_max[2];
      if constexpr (kQkFp8) {
        float m[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < kKeyTiles; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!kMask || key_of(i, e) < valid) m[e >> 1] = fmaxf(m[e >> 1], s[c][i][e]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], 1));
          tile_max[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], 2));
        }
      } else {
        int m[2] = {INT_MIN, INT_MIN};
#pragma unroll
        for (int i = 0; i < kKeyTiles; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!kMask || key_of(i, e) < valid) m[e >> 1] = max(m[e >> 1], s[c][i][e]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          m[h] = max(m[h], __shfl_xor_sync(0xffffffffu, m[h], 1));
          m[h] = max(m[h], __shfl_xor_sync(0xffffffffu, m[h], 2));
          tile_max[h] = small_int_to_float(m[h]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float offset = fmaxf(row_offset[c][h], tile_max[h] * scale[c][h]);
        alpha[c][h] = Encoder::rescale(row_offset[c][h] - offset);
        row_offset[c][h] = offset;
        prow[c][h] = Encoder::p_row(scale[c][h], offset);
      }
    }

    // ---- P in E4M3, directly in the A-operand layout of the PV MMA
    uint32_t p_frag[kWideChains][kPSteps][4];
#pragma unroll
    for (int c = 0; c < kWideChains; ++c)
#pragma unroll
      for (int ks = 0; ks < kPSteps; ++ks)
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
          // reg 0/1: rows g/g+8 of keys 32ks+4t..; reg 2/3: the same 16 keys later
          const int i0 = 4 * ks + 2 * (reg >> 1);
          const int e0 = 2 * (reg & 1);
          float a[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int i = i0 + (j >> 1), e = e0 + (j & 1);
            const float raw = kQkFp8 ? float(s[c][i][e]) : small_int_to_float(int(s[c][i][e]));
            a[j] = (kMask && key_of(i, e) >= valid) ? Encoder::p_masked_arg() : Encoder::p_arg(raw, prow[c][reg & 1]);
          }
          p_frag[c][ks][reg] = Encoder{}.encode_p(a);
        }

    // ---- row sums of the same P (ones column), then O = alpha O + P R (+ l mu / v_scale)
    float l_tile[kWideChains][4];
#pragma unroll
    for (int c = 0; c < kWideChains; ++c) {
      l_tile[c][0] = l_tile[c][1] = l_tile[c][2] = l_tile[c][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kPSteps; ++ks) mma_e4m3(l_tile[c], p_frag[c][ks], kE4m3OnesX4, kE4m3OnesX4);
      row_sum[c][0] = row_sum[c][0] * alpha[c][0] + l_tile[c][0];
      row_sum[c][1] = row_sum[c][1] * alpha[c][1] + l_tile[c][2];
    }

    const uint32_t v_base = sbase + Smem::kOffV + stage * Smem::kV;
    const __half* mean = reinterpret_cast<const __half*>(smem + Smem::kOffMean + stage * Smem::kMean);
    const float* inv_scale = reinterpret_cast<const float*>(smem + Smem::kOffInvScale);
#pragma unroll
    for (int pair = 0; pair < kDimTiles / 2; ++pair) {
      float part[kWideChains][2][4] = {};
      const int dim = 16 * pair + (matrix >> 1) * 8 + r;
#pragma unroll
      for (int ks = 0; ks < kPSteps; ++ks) {
        uint32_t b[4];
        ldmatrix_x4(b, v_base + swizzled<kChunkKeys>(dim, 2 * ks + (matrix & 1)));
#pragma unroll
        for (int c = 0; c < kWideChains; ++c) {
          mma_e4m3(part[c][0], p_frag[c][ks], b[0], b[1]);
          mma_e4m3(part[c][1], p_frag[c][ks], b[2], b[3]);
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = 2 * pair + half;
        float mu[2] = {0.0f, 0.0f};
        if constexpr (kVSmooth) {
          const int col = 8 * i + 2 * t;
          const float2 m = __half22float2(*reinterpret_cast<const __half2*>(mean + col));
          const float2 inv = *reinterpret_cast<const float2*>(inv_scale + col);
          mu[0] = m.x * inv.x;
          mu[1] = m.y * inv.y;
        }
#pragma unroll
        for (int c = 0; c < kWideChains; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float restore = kVSmooth ? l_tile[c][e & 2] * mu[e & 1] : 0.0f;
            acc[c][i][e] = fmaf(acc[c][i][e], alpha[c][e >> 1], part[c][half][e] + restore);
          }
      }
    }
  }

  __device__ __forceinline__ void store_output(const AttnParams& p, int bh, int warp_row0, int lane) const {
    const int g = lane >> 2, t = lane & 3;
    const int b = bh / p.heads, h = bh % p.heads;
    const float* v_scale = p.v_scale + int64_t(bh) * D;
#pragma unroll
    for (int c = 0; c < kWideChains; ++c)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp_row0 + 16 * c + g + 8 * half;
        if (row >= p.n) continue;
        const float inv_l = 1.0f / row_sum[c][half];
        uint16_t* dst = static_cast<uint16_t*>(p.out) + b * p.o_stride[0] + h * p.o_stride[1] + int64_t(row) * p.o_stride[2];
#pragma unroll
        for (int i = 0; i < kDimTiles; ++i) {
          const int col = 8 * i + 2 * t;
          const float2 sc = *reinterpret_cast<const float2*>(v_scale + col);
          const float lo = acc[c][i][2 * half] * sc.x * inv_l, hi = acc[c][i][2 * half + 1] * sc.y * inv_l;
          *reinterpret_cast<uint32_t*>(dst + col) = p.out_bf16 ? pack2<__nv_bfloat16>(lo, hi)
                                                                : pack2<__half>(saturate_fp16(lo), saturate_fp16(hi));
        }
        if (p.lse != nullptr && t == 0) {
          // sum_j 2^s_ij = l * 2^(M - 8) (ExpCast: its own scale, approximately); natural-log units
          const float log2_scale = kExpCast ? vc_p::kExpCastLog2Scale : kPLog2Max;
          p.lse[int64_t(bh) * p.n + row] = (row_offset[c][half] - log2_scale + log2f(row_sum[c][half])) * kLn2;
        }
      }
  }
};

template <int D, bool kQkFp8, bool kExpCast, bool kVSmooth>
__global__ VC_MMA_LAUNCH_BOUNDS void attn_mma_wide_kernel(const AttnParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  AttnMmaWide<D, kQkFp8, kExpCast, kVSmooth> kernel;
  kernel.run(p, smem);
}

}  // namespace vc
