// Portable VC-Attention forward kernel (mma.sync; sm_89 Ada, sm_90 Hopper, sm_120 Blackwell).
//
// One CTA = 64 query rows x all keys, 4 warps of 16 rows (one Q scale per row). Per 128-key tile
// (one K scale, one V-Smooth mean), in softmax steps of kStepKeys keys: S = Q K^T with m16n8k32 s8 (or e4m3) MMAs, online softmax in
// log2 units with the exact running max M (reference.running_row_offsets) and P's argument formed
// by one multiply-add with the row constant float32(c - M) as the reference forms it, P packed to
// E4M3 in registers (exp2 + cast, or ExpCast codes), the rescale 2^(M_old - M_new) by ex2.approx
// (fidelity) or the FMA polynomial vc_p::exp2_rescale (speed: no MUFU in its loop), and
// O += P R with m16n8k32 e4m3 MMAs into a fresh per-tile accumulator that is then added to the
// float32 total (two-level accumulation). Row sums come from the same P through a ones column;
// V-Smooth adds l_tile * mu_tile / v_scale, and the epilogue multiplies by v_scale / l.
//
// Speed path: P is p_encoding.cuh's integer form (reference.expcast_bits), one integer max and one
// IMAD per element on the raw int32 score from per-row constants of the step's integer max; FP8 QK
// (float scores) takes its float-score form.
//
// Key order trick: in the QK MMA, lane rows of K are fetched so that S's accumulator layout IS the
// A-operand layout of the PV MMA (thread (g, t) holds keys 4t..4t+3 of every 16-key group), so P
// needs no shuffles: column c of n-tile 2j+h of a 16-key group holds key 4(c/2) + 2h + c%2.
#pragma once
#include "common.cuh"
#include "p_encoding.cuh"
#include "vc_params.h"

namespace vc {

// Keys per softmax step inside a 128-key tile: 64 halves the score registers (more CTAs per SM)
// at the price of a second rescale per tile. Overridable at build time to time both.
#ifndef VC_MMA_STEP_KEYS
#define VC_MMA_STEP_KEYS 128
#endif
// VC_MMA_MIN_BLOCKS: optional CTAs-per-SM hint for ptxas (its absence lets ptxas use up to 255
// registers without spilling; naming even 1 or 2 made it spill in sm_90a builds).
#ifdef VC_MMA_MIN_BLOCKS
#define VC_MMA_LAUNCH_BOUNDS __launch_bounds__(kAttnThreads, VC_MMA_MIN_BLOCKS)
#else
#define VC_MMA_LAUNCH_BOUNDS __launch_bounds__(kAttnThreads)
#endif
// VC_MMA_EXP2_POLY = n (0-4, variants): in exp2 + cast mode (fidelity, plain 8-bit), the last n of each k-step's four
// P registers take 2^x from vc_p::exp2_poly_e4m3 on the FMA pipe instead of MUFU.EX2 (n / 4 of the chunk's
// exponentials), meant to take load off the quarter-rate MUFU pipe. Measured slower (H100, head dim 64, plain 8-bit
// +10% at n = 1, +17% at 2: the chunk is latency-bound, not MUFU-bound; docs/kernel-notes.md 48): kept for comparison
#ifndef VC_MMA_EXP2_POLY
#define VC_MMA_EXP2_POLY 0
#endif
static_assert(VC_MMA_EXP2_POLY >= 0 && VC_MMA_EXP2_POLY <= 4, "VC_MMA_EXP2_POLY is a count of P registers (0-4)");
constexpr int kStepKeys = VC_MMA_STEP_KEYS;
static_assert(kStepKeys == 64 || kStepKeys == 128, "VC_MMA_STEP_KEYS must be 64 or 128");

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = kAttnWarps * 32;
constexpr int kRowsPerWarp = 16;

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile whose rows are kRowBytes
// long: XOR-ing the chunk with bits of the row makes the 8 rows read by one ldmatrix hit 8
// distinct bank groups. kKeyRows: the tile is read in the permuted key order described above
// (rows {0,1,4,5,8,9,12,13} + const), which needs other row bits than 8 consecutive rows.
//
// Identities the wide kernel's address arithmetic rests on (attn_mma_wide.cuh checks them for every lane at compile
// time; the chunk bits 4-6 are all the XOR touches, row * kRowBytes has none of them):
//   swizzled(row, c0 + 2 ks) == swizzled(row, c0) ^ (ks << 5)          for c0 in {0, 1}
//   swizzled(row + 16 j, c) == swizzled(row, c) + 16 j kRowBytes        (the mix reads row bits 0-3 only)
//   swizzled(row, c) == (row * kRowBytes + 16 c) ^ (mix(row) << 4)
template <int kRowBytes, bool kKeyRows = false>
__host__ __device__ __forceinline__ constexpr int swizzle_mix(int row) {
  static_assert(kRowBytes == 64 || kRowBytes == 128, "rows of 64 or 128 bytes");
  if constexpr (kKeyRows) {
    return kRowBytes == 128 ? (((row >> 2) & 3) << 1) | (row & 1) : (row >> 2) & 3;
  } else {
    return kRowBytes == 128 ? row & 7 : (row >> 1) & 3;
  }
}

template <int kRowBytes, bool kKeyRows = false>
__host__ __device__ __forceinline__ constexpr uint32_t swizzled(int row, int chunk) {
  return uint32_t(row * kRowBytes + (chunk ^ swizzle_mix<kRowBytes, kKeyRows>(row)) * 16);
}

// Copies a [rows x kRowBytes] tile (global rows `src_stride` bytes apart) into swizzled smem.
template <int kRowBytes, int kRows, bool kKeyRows = false>
__device__ __forceinline__ void load_tile_async(uint32_t dst, const uint8_t* src, int64_t src_stride) {
  constexpr int kChunksPerRow = kRowBytes / 16;
#pragma unroll
  for (int idx = threadIdx.x; idx < kRows * kChunksPerRow; idx += kAttnThreads) {
    const int row = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
    cp_async_16(dst + swizzled<kRowBytes, kKeyRows>(row, chunk), src + row * src_stride + chunk * 16);
  }
}

template <int D>
struct AttnSmem {
  static constexpr int kQ = kQBlock * D;          // Q tile, bytes
  static constexpr int kK = kKBlock * D;          // one K tile
  static constexpr int kV = D * kKBlock;          // one transposed V tile
  static constexpr int kMean = D * 2;             // one fp16 mean row
  static constexpr int kOffK = kQ;
  static constexpr int kOffV = kOffK + 2 * kK;
  static constexpr int kOffMean = kOffV + 2 * kV;
  static constexpr int kOffInvScale = kOffMean + 2 * kMean;
  static constexpr int kBytes = kOffInvScale + D * 4;
};

template <int D, bool kQkFp8, bool kExpCast, bool kVSmooth>
struct AttnMma {
  static constexpr int kKSteps = D / 32;        // MMA k-steps over the head dim (QK)
  static constexpr int kKeyTiles = kStepKeys / 8;  // n-tiles of S per softmax step
  static constexpr int kDimTiles = D / 8;        // n-tiles of O
  static constexpr int kPSteps = kStepKeys / 32;  // MMA k-steps over keys (PV) per softmax step
  using Smem = AttnSmem<D>;
  using SAcc = std::conditional_t<kQkFp8, float, int>;
  // ExpCast on int8 scores: the integer form (p_encoding.cuh); on FP8 scores (float sums) its float-score
  // form; the byte-code variants (VC_EXPCAST_PAPER / _ALU) keep the float argument of p_row / p_arg
  static constexpr bool kIntEnc = kExpCast && !kQkFp8 && !VC_EXPCAST_BYTE_CODES;
  static constexpr bool kFloatEnc = kExpCast && kQkFp8 && !VC_EXPCAST_BYTE_CODES;

  // per-thread state of the online softmax for rows g and g+8 of the warp
  float acc[kDimTiles][4];
  float row_offset[2];  // M, the running max of the scaled scores (-inf before the first tile)
  float row_sum[2];
  uint32_t q_frag[kKSteps][4];

  __device__ __forceinline__ void run(const AttnParams& p, uint8_t* smem) {
    const int bh = blockIdx.y;
    const int q_row0 = blockIdx.x * kQBlock;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_tiles = p.n_pad / kKBlock;
    const uint32_t sbase = smem_addr(smem);
    const uint8_t* q_src = static_cast<const uint8_t*>(p.q_q) + (int64_t(bh) * p.n_pad + q_row0) * D;
    const uint8_t* k_src = static_cast<const uint8_t*>(p.k_q) + int64_t(bh) * p.n_pad * D;
    const uint8_t* v_src = p.v_t + int64_t(bh) * D * p.n_pad;
    const uint8_t* mean_src = reinterpret_cast<const uint8_t*>(p.v_mean) + int64_t(bh) * n_tiles * D * 2;
    float* inv_scale = reinterpret_cast<float*>(smem + Smem::kOffInvScale);

    auto load_kv = [&](int tile) {
      const int buf = tile & 1;
      load_tile_async<D, kKBlock, true>(sbase + Smem::kOffK + buf * Smem::kK, k_src + int64_t(tile) * kKBlock * D, D);
      load_tile_async<kKBlock, D>(sbase + Smem::kOffV + buf * Smem::kV, v_src + tile * kKBlock, p.n_pad);
      if constexpr (kVSmooth) {
        if (threadIdx.x < Smem::kMean / 16)
          cp_async_16(sbase + Smem::kOffMean + buf * Smem::kMean + threadIdx.x * 16, mean_src + int64_t(tile) * Smem::kMean + threadIdx.x * 16);
      }
    };

    load_tile_async<D, kQBlock>(sbase, q_src, D);
    load_kv(0);
    cp_async_commit();
    if constexpr (kVSmooth) {
      for (int c = threadIdx.x; c < D; c += kAttnThreads) inv_scale[c] = 1.0f / p.v_scale[int64_t(bh) * D + c];
    }
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    row_offset[0] = row_offset[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
    // the scales of this thread's rows g and g+8 (padded rows, < n_pad, have scale 0)
    const float* q_sc_rows = p.q_scale + int64_t(bh) * p.n_pad + q_row0 + warp * kRowsPerWarp + (lane >> 2);
    const float q_scale[2] = {q_sc_rows[0], q_sc_rows[8]};
    const int tail = p.n - (n_tiles - 1) * kKBlock;  // valid keys in the last tile

    for (int tile = 0; tile < n_tiles; ++tile) {
      if (tile + 1 < n_tiles) {
        load_kv(tile + 1);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      if (tile == 0) load_q_fragments(sbase, warp, lane);
      const int buf = tile & 1;
      const float k_scale = p.k_scale[int64_t(bh) * n_tiles + tile];
      const float scale[2] = {q_scale[0] * k_scale, q_scale[1] * k_scale};
      if (tile + 1 == n_tiles && tail < kKBlock) {
        process_keys<true>(sbase, buf, 0, scale, tail, lane, smem);
        if (kStepKeys < kKBlock && tail > kStepKeys) process_keys<true>(sbase, buf, kStepKeys, scale, tail, lane, smem);
      } else {
        process_keys<false>(sbase, buf, 0, scale, kKBlock, lane, smem);
        if (kStepKeys < kKBlock) process_keys<false>(sbase, buf, kStepKeys, scale, kKBlock, lane, smem);
      }
      __syncthreads();
    }
    store_output(p, bh, q_row0 + warp * kRowsPerWarp, lane);
  }

  __device__ __forceinline__ void load_q_fragments(uint32_t sbase, int warp, int lane) {
    const int matrix = lane >> 3, r = lane & 7;
    const int row = warp * kRowsPerWarp + (matrix & 1) * 8 + r;
#pragma unroll
    for (int s = 0; s < kKSteps; ++s) ldmatrix_x4(q_frag[s], sbase + swizzled<D>(row, 2 * s + (matrix >> 1)));
  }

  // keys [key0, key0 + kStepKeys) of the tile in buffer `buf`; `valid` keys of the tile are real
  template <bool kMask>
  __device__ __forceinline__ void process_keys(uint32_t sbase, int buf, int key0, const float (&scale)[2], int valid, int lane,
                                               uint8_t* smem) {
    const int t = lane & 3;
    // ---- S = Q K^T (scores before scaling), key order as described at the top
    SAcc s[kKeyTiles][4];
#pragma unroll
    for (int i = 0; i < kKeyTiles; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = SAcc(0);
    {
      const int matrix = lane >> 3, r = lane & 7;
      const uint32_t k_base = sbase + Smem::kOffK + buf * Smem::kK;
#pragma unroll
      for (int pair = 0; pair < kKeyTiles / 2; ++pair) {
        const int key = key0 + 16 * pair + 4 * (r >> 1) + 2 * (matrix >> 1) + (r & 1);
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
          uint32_t b[4];
          ldmatrix_x4(b, k_base + swizzled<D, true>(key, 2 * ks + (matrix & 1)));
          if constexpr (kQkFp8) {
            mma_e4m3(s[2 * pair], q_frag[ks], b[0], b[1]);
            mma_e4m3(s[2 * pair + 1], q_frag[ks], b[2], b[3]);
          } else {
            mma_s8(s[2 * pair], q_frag[ks], b[0], b[1]);
            mma_s8(s[2 * pair + 1], q_frag[ks], b[2], b[3]);
          }
        }
      }
    }
    // key index (within the tile) of accumulator element e of n-tile i for this thread
    auto key_of = [&](int i, int e) { return key0 + 16 * (i >> 1) + 4 * t + 2 * (i & 1) + (e & 1); };

    // ---- row max -> new running offset (max of raw scores: scaling by scale >= 0 is monotone)
    float tile_max[2];
    int tile_max_int[2];  // int8 scores: the exact integer max, a0 of the integer form
    if constexpr (kQkFp8) {
      float m[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int i = 0; i < kKeyTiles; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!kMask || key_of(i, e) < valid) m[e >> 1] = fmaxf(m[e >> 1], s[i][e]);
      tile_max[0] = m[0];
      tile_max[1] = m[1];
    } else {
      int m[2] = {INT_MIN, INT_MIN};
#pragma unroll
      for (int i = 0; i < kKeyTiles; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!kMask || key_of(i, e) < valid) m[e >> 1] = max(m[e >> 1], s[i][e]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m[h] = max(m[h], __shfl_xor_sync(0xffffffffu, m[h], 1));
        m[h] = max(m[h], __shfl_xor_sync(0xffffffffu, m[h], 2));
        tile_max_int[h] = m[h];
        tile_max[h] = small_int_to_float(m[h]);
      }
    }
    float alpha[2], offset[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (kQkFp8) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      }
      offset[h] = fmaxf(row_offset[h], tile_max[h] * scale[h]);
      alpha[h] = rescale(row_offset[h] - offset[h]);
      row_offset[h] = offset[h];
    }

    // ---- P in E4M3, directly in the A-operand layout of the PV MMA
    uint32_t p_frag[kPSteps][4];
#if VC_EXPCAST_INT
    if constexpr (kIntEnc) {
      const vc_p::ExpCastIntRow irow[2] = {vc_p::expcast_int_row(scale[0], tile_max_int[0], offset[0]),
                                           vc_p::expcast_int_row(scale[1], tile_max_int[1], offset[1])};
      encode_p_fragments_int<kMask>(s, irow, valid, key_of, p_frag);
    } else if constexpr (kFloatEnc) {
      const vc_p::ExpCastFloatRow frow[2] = {vc_p::expcast_float_row(scale[0], tile_max[0], offset[0]),
                                             vc_p::expcast_float_row(scale[1], tile_max[1], offset[1])};
      encode_p_fragments_float<kMask>(s, frow, valid, key_of, p_frag);
    } else
#endif
    {
      const ArgRow prow[2] = {p_row(scale[0], offset[0]), p_row(scale[1], offset[1])};
      encode_p_fragments<kMask>(s, prow, valid, key_of, p_frag);
    }

    // ---- O = alpha O + P R (+ l mu / v_scale), per-tile accumulator added into the total
    float l_tile[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < kPSteps; ++ks) mma_e4m3(l_tile, p_frag[ks], kE4m3OnesX4, kE4m3OnesX4);
    row_sum[0] = row_sum[0] * alpha[0] + l_tile[0];
    row_sum[1] = row_sum[1] * alpha[1] + l_tile[2];

    const int matrix = lane >> 3, r = lane & 7;
    const uint32_t v_base = sbase + Smem::kOffV + buf * Smem::kV;
    const __half* mean = reinterpret_cast<const __half*>(smem + Smem::kOffMean + buf * Smem::kMean);
    const float* inv_scale = reinterpret_cast<const float*>(smem + Smem::kOffInvScale);
#pragma unroll
    for (int pair = 0; pair < kDimTiles / 2; ++pair) {
      float part[2][4] = {};
      const int dim = 16 * pair + (matrix >> 1) * 8 + r;
#pragma unroll
      for (int ks = 0; ks < kPSteps; ++ks) {
        uint32_t b[4];
        ldmatrix_x4(b, v_base + swizzled<kKBlock>(dim, key0 / 16 + 2 * ks + (matrix & 1)));
        mma_e4m3(part[0], p_frag[ks], b[0], b[1]);
        mma_e4m3(part[1], p_frag[ks], b[2], b[3]);
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
        for (int e = 0; e < 4; ++e) {
          const float restore = kVSmooth ? l_tile[e & 2] * mu[e & 1] : 0.0f;
          acc[i][e] = fmaf(acc[i][e], alpha[e >> 1], part[half][e] + restore);
        }
      }
    }
  }

  // The per-row constants of P's float argument: exp2: arg = fmaf(raw score, scale, float32(8 - M))
  // (reference.p_exp2_cast); the byte-code ExpCast variants: their saturated argument (p_encoding.cuh).
  struct ArgRow {
    float mul, add;
  };
  static __device__ __forceinline__ ArgRow p_row(float scale, float m) {
#if VC_EXPCAST_BYTE_CODES
    if constexpr (kExpCast) {
      const vc_p::ExpCastRow r = vc_p::expcast_row(scale, m);
      return {r.mul, r.add};
    }
#endif
    return {scale, kPLog2Max - m};
  }
  static __device__ __forceinline__ float p_arg(float raw, const ArgRow& row) {
#if VC_EXPCAST_BYTE_CODES
    if constexpr (kExpCast) return vc_p::expcast_arg(raw, vc_p::ExpCastRow{row.mul, row.add});
#endif
    return fmaf(raw, row.mul, row.add);
  }
  static __device__ __forceinline__ float p_masked_arg() { return kExpCast ? 0.0f : -INFINITY; }  // both: code 0

  // alpha = 2^d, d = M_old - M_new <= 0: the speed path stays off MUFU (vc_p::exp2_rescale)
  static __device__ __forceinline__ float rescale(float d) { return kExpCast ? vc_p::exp2_rescale(d) : fast_exp2(d); }

  // The P fragments of KEY_TILES n-tiles of scores (both layouts keep them as SAcc[tile][4]) as the A
  // fragments of the PV MMA: register reg of k-step ks holds rows g (reg 0, 2) / g+8 (reg 1, 3) of
  // keys 32 ks + 4t .. (reg 0/1) and the same 16 keys later (reg 2/3). element(i, e, row): the float
  // of score s[i][e] of row `row` (0: g, 1: g+8) that pack turns, four at a time, into E4M3 bytes.
  template <int KEY_TILES, typename Element, typename Pack>
  static __device__ __forceinline__ void build_p_fragments(Element element, Pack pack, uint32_t (&p_frag)[KEY_TILES / 4][4]) {
#pragma unroll
    for (int ks = 0; ks < KEY_TILES / 4; ++ks) {
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const int i0 = 4 * ks + 2 * (reg >> 1);
        const int e0 = 2 * (reg & 1);
        float a[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) a[j] = element(i0 + (j >> 1), e0 + (j & 1), reg & 1);
        p_frag[ks][reg] = pack(a, reg);
      }
    }
  }

  // P from the rows' float-argument constants prow (p_row): p_arg of each score, p_masked_arg for masked keys.
  template <bool kMask, int KEY_TILES, typename KeyOf>
  static __device__ __forceinline__ void encode_p_fragments(const SAcc (&s)[KEY_TILES][4], const ArgRow (&prow)[2],
                                                            int valid, KeyOf key_of, uint32_t (&p_frag)[KEY_TILES / 4][4]) {
    build_p_fragments<KEY_TILES>(
        [&](int i, int e, int row) {
          const float raw = kQkFp8 ? float(s[i][e]) : small_int_to_float(int(s[i][e]));
          return (kMask && key_of(i, e) >= valid) ? p_masked_arg() : p_arg(raw, prow[row]);
        },
        [](const float (&a)[4], int reg) { return encode_p(a, reg); }, p_frag);
  }

#if VC_EXPCAST_INT
  // P in the integer form (kIntEnc) from the rows' constants of the step's integer max: the float whose
  // E4M3 cast is the code, straight from the int32 score; a masked key passes INT_MIN (code 0).
  // kClamp false: only where no score can wrap its code (VC_MMA_CLAMP_BOUND's vote), never with masked keys.
  template <bool kMask, int KEY_TILES, typename KeyOf, bool kClamp = true>
  static __device__ __forceinline__ void encode_p_fragments_int(const int (&s)[KEY_TILES][4], const vc_p::ExpCastIntRow (&irow)[2],
                                                                int valid, KeyOf key_of, uint32_t (&p_frag)[KEY_TILES / 4][4]) {
    static_assert(kClamp || !kMask, "a masked key needs the clamp (INT_MIN)");
    build_p_fragments<KEY_TILES>(
        [&](int i, int e, int row) {
          if constexpr (!kClamp) return vc_p::expcast_int_float_unclamped(s[i][e], irow[row]);
          return vc_p::expcast_int_float((kMask && key_of(i, e) >= valid) ? INT_MIN : s[i][e], irow[row]);
        },
        [](const float (&f)[4], int) { return vc_p::cast_e4m3x4(f[0], f[1], f[2], f[3]); }, p_frag);
  }

  // P in the float-score form (kFloatEnc, FP8 QK) from the rows' constants of the step's float max; a
  // masked key passes -inf (code 0).
  template <bool kMask, int KEY_TILES, typename KeyOf>
  static __device__ __forceinline__ void encode_p_fragments_float(const float (&s)[KEY_TILES][4], const vc_p::ExpCastFloatRow (&frow)[2],
                                                                  int valid, KeyOf key_of, uint32_t (&p_frag)[KEY_TILES / 4][4]) {
    build_p_fragments<KEY_TILES>(
        [&](int i, int e, int row) {
          return vc_p::expcast_float_acc((kMask && key_of(i, e) >= valid) ? -INFINITY : s[i][e], frow[row]);
        },
        [](const float (&f)[4], int) { return vc_p::cast_e4m3x4(f[0], f[1], f[2], f[3]); }, p_frag);
  }
#endif

  // four arguments (p_arg, or p_masked_arg for masked keys) -> four E4M3 bytes, first in the lowest byte; reg: the
  // fragment register (0-3) they fill, whose last VC_MMA_EXP2_POLY take exp2 on the FMA pipe instead of MUFU
  static __device__ __forceinline__ uint32_t encode_p(const float (&a)[4], int reg) {
#if VC_EXPCAST_BYTE_CODES
    if constexpr (kExpCast) return vc_p::expcast_pack4(a[0], a[1], a[2], a[3]);
#endif
    if (reg >= 4 - VC_MMA_EXP2_POLY)  // unrolled: reg is a constant, the branch goes at compile time
      return e4m3x4(vc_p::exp2_poly_e4m3(a[0]), vc_p::exp2_poly_e4m3(a[1]), vc_p::exp2_poly_e4m3(a[2]),
                    vc_p::exp2_poly_e4m3(a[3]));
    return e4m3x4(fast_exp2(a[0]), fast_exp2(a[1]), fast_exp2(a[2]), fast_exp2(a[3]));
  }

  __device__ __forceinline__ void store_output(const AttnParams& p, int bh, int warp_row0, int lane) const {
    const int g = lane >> 2, t = lane & 3;
    const int b = bh / p.heads, h = bh % p.heads;
    const float* v_scale = p.v_scale + int64_t(bh) * D;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_row0 + g + 8 * half;
      if (row >= p.n) continue;
      const float inv_l = 1.0f / row_sum[half];
      uint16_t* dst = static_cast<uint16_t*>(p.out) + b * p.o_stride[0] + h * p.o_stride[1] + int64_t(row) * p.o_stride[2];
#pragma unroll
      for (int i = 0; i < kDimTiles; ++i) {
        const int col = 8 * i + 2 * t;
        const float2 sc = *reinterpret_cast<const float2*>(v_scale + col);
        const float lo = acc[i][2 * half] * sc.x * inv_l, hi = acc[i][2 * half + 1] * sc.y * inv_l;
        *reinterpret_cast<uint32_t*>(dst + col) = p.out_bf16 ? pack2<__nv_bfloat16>(lo, hi)
                                                                : pack2<__half>(saturate_fp16(lo), saturate_fp16(hi));
      }
      if (p.lse != nullptr && t == 0) {
        // sum_j 2^s_ij = l * 2^(M - 8) (ExpCast: its own scale, approximately); natural-log units
        const float log2_scale = kExpCast ? vc_p::kExpCastLog2Scale : kPLog2Max;
        p.lse[int64_t(bh) * p.n + row] = (row_offset[half] - log2_scale + log2f(row_sum[half])) * kLn2;
      }
    }
  }
};

template <int D, bool kQkFp8, bool kExpCast, bool kVSmooth>
__global__ VC_MMA_LAUNCH_BOUNDS void attn_mma_kernel(const AttnParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  AttnMma<D, kQkFp8, kExpCast, kVSmooth> kernel;
  kernel.run(p, smem);
}

}  // namespace vc
