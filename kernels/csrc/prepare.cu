// Launcher of the fused preprocessing kernels (prepare.cuh): dtype / head-dim / QK-format dispatch.
#include "prepare.cuh"
#include "prepare_k_lanes.cuh"
#include "prepare_regs.cuh"
#include "prepare_segments.cuh"

#ifndef VC_PREP_LEGACY_QUANTIZE
// 1 (variant): prepare.cuh's quantize kernel (one row loaded per iteration, byte-wise V^T transpose)
// instead of prepare_staged.cuh's; kept for side-by-side timing (bench/prepare_variants.py)
#define VC_PREP_LEGACY_QUANTIZE 0
#endif
#ifndef VC_PREP_STAGED_STATS
// 1 (variant): prepare_staged.cuh's statistics kernel (each tensor's rows issued at once, V read once)
// instead of prepare.cuh's; measured slower on the H200 (110 vs 94 us at Wan2.1-1.3B: 74 registers, three
// blocks per SM instead of five; docs/kernel-notes.md section 22)
#define VC_PREP_STAGED_STATS 0
#endif
#ifndef VC_PREP_ROWS_IN_REGS
#define VC_PREP_ROWS_IN_REGS 0  // 1 (variant): prepare_regs.cuh's kernels, every load of a block issued first
#endif

namespace vc {

// The V residual's second term (v_lo_channels; prepare_v_lo.cuh) is in the default build's passes only: the
// variants' kernels are not instantiated for it (prepare_refusal refuses it there).
constexpr bool kVLoBuild = !(VC_PREP_ROWS_IN_REGS || VC_PREP_LEGACY_QUANTIZE || VC_PREP_STAGED_STATS || VC_PREP_STATS_PREFETCH);

// The two halves of the prepare, launched apart (launch_prepare_stats, then launch_prepare_quantize) so that
// the binding can put the statistics pass on the GPU before it allocates the quantized operands: a short
// call's host work before its first launch is GPU idle time (docs/kernel-notes.md section 28).
// The statistics pass: it writes the workspace (with segments, the 256-row blocks' statistics there too) and
// v_mean only; the segments kernel, which reads those block statistics and writes v_seg_end, runs in the
// quantize half.
template <typename T, int D>
static void launch_stats_typed(const PrepareParams& p, cudaStream_t stream) {
  const dim3 grid(p.n_pad / kKBlock, p.batch * p.heads);
  // one block per V-Smooth mean (v_mean_rows rows; prepare_refusal admits 256 for prepare.cuh's
  // statistics kernel only)
  const dim3 stats_grid((p.n_pad + p.v_mean_rows - 1) / p.v_mean_rows, p.batch * p.heads);
  if constexpr (VC_PREP_ROWS_IN_REGS) {
    prepare_stats_regs_kernel<T, D><<<grid, kPrepThreads, 0, stream>>>(p);
  } else if (p.v_rank) {  // V-Smooth's low-rank term: its own instantiations (registers)
    prepare_stats_kernel<T, D, true><<<stats_grid, kPrepThreads, 0, stream>>>(p);
  } else {
    if constexpr (VC_PREP_STAGED_STATS) {
      prepare_stats_staged_kernel<T, D><<<grid, kPrepThreads, 0, stream>>>(p);
    } else {
      // the K extremes serve the quantize pass's pair amax (the K lanes kernel has its rows)
      const bool k_pair = p.k_pair && !p.k_lanes;
      if (p.v_lo_channels) {
        if constexpr (kVLoBuild) {
          if (k_pair)
            prepare_stats_kernel<T, D, false, true, true><<<stats_grid, kPrepThreads, 0, stream>>>(p);
          else
            prepare_stats_kernel<T, D, false, false, true><<<stats_grid, kPrepThreads, 0, stream>>>(p);
        }
      } else if (k_pair) {
        prepare_stats_kernel<T, D, false, true><<<stats_grid, kPrepThreads, 0, stream>>>(p);
      } else {
        prepare_stats_kernel<T, D><<<stats_grid, kPrepThreads, 0, stream>>>(p);
      }
    }
  }
}

// The segments (block statistics -> segment means, ends and the residual's amax bound), then the quantize
// pass: every operand of the contract.
template <typename T, int D>
static void launch_quantize_typed(const PrepareParams& p, cudaStream_t stream) {
  const dim3 grid(p.n_pad / kKBlock, p.batch * p.heads);
  if constexpr (VC_PREP_ROWS_IN_REGS) {
    if (p.qk_fp8) {
      prepare_quantize_regs_kernel<T, D, true><<<grid, kPrepThreads, 0, stream>>>(p);
    } else {
      prepare_quantize_regs_kernel<T, D, false><<<grid, kPrepThreads, 0, stream>>>(p);
    }
  } else if (p.v_rank) {
    if (p.qk_fp8) {
      prepare_quantize_kernel<T, D, true, true><<<grid, kPrepThreads, 0, stream>>>(p);
    } else {
      prepare_quantize_kernel<T, D, false, true><<<grid, kPrepThreads, 0, stream>>>(p);
    }
  } else {
    if (p.v_merge) prepare_segments_kernel<D><<<p.batch * p.heads, kSegThreads, 0, stream>>>(p);
    // the second term's channels, from the statistics blocks' energies (with segments, once their means are known)
    if constexpr (kVLoBuild) {
      if (p.v_lo_channels) prepare_v_lo_select_kernel<D><<<p.batch * p.heads, kVLoSelectThreads, 0, stream>>>(p);
    }
    // K scales per lane: K's codes, scales and lane order first (the quantize pass's V follows the order)
    if (p.k_lanes)
      prepare_k_lanes_kernel<T, D><<<dim3((p.n_pad + 2 * kKBlock - 1) / (2 * kKBlock), p.batch * p.heads), kPrepThreads, 0, stream>>>(p);
    if constexpr (VC_PREP_LEGACY_QUANTIZE) {
      if (p.qk_fp8) {
        prepare_quantize_kernel<T, D, true><<<grid, kPrepThreads, 0, stream>>>(p);
      } else {
        prepare_quantize_kernel<T, D, false><<<grid, kPrepThreads, 0, stream>>>(p);
      }
    } else if (p.v_lo_channels) {
      if constexpr (kVLoBuild) {
        if (p.qk_fp8)
          prepare_quantize_staged_kernel<T, D, true, true><<<grid, kPrepThreads, 0, stream>>>(p);
        else
          prepare_quantize_staged_kernel<T, D, false, true><<<grid, kPrepThreads, 0, stream>>>(p);
      }
    } else if (p.qk_fp8) {
      prepare_quantize_staged_kernel<T, D, true><<<grid, kPrepThreads, 0, stream>>>(p);
    } else {
      prepare_quantize_staged_kernel<T, D, false><<<grid, kPrepThreads, 0, stream>>>(p);
    }
  }
}

int prepare_rows_in_regs() { return VC_PREP_ROWS_IN_REGS; }
int prepare_legacy_quantize() { return VC_PREP_LEGACY_QUANTIZE; }
int prepare_staged_stats() { return VC_PREP_STAGED_STATS; }
int prepare_stats_prefetch() { return VC_PREP_STATS_PREFETCH; }

template <bool kStats, typename T>
static void launch_half_dim(const PrepareParams& p, cudaStream_t stream) {
  if (p.head_dim == 64) {
    kStats ? launch_stats_typed<T, 64>(p, stream) : launch_quantize_typed<T, 64>(p, stream);
  } else {
    kStats ? launch_stats_typed<T, 128>(p, stream) : launch_quantize_typed<T, 128>(p, stream);
  }
}

template <bool kStats>
static const char* launch_half(const PrepareParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.input_bf16) {
    launch_half_dim<kStats, __nv_bfloat16>(p, s);
  } else {
    launch_half_dim<kStats, __half>(p, s);
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

const char* prepare_refusal(const PrepareParams& p) {
  if (VC_PREP_ROWS_IN_REGS && p.v_rank) return "the rows-in-regs prepare variant has no low-rank V term";
  if (p.v_mean_rows != kKBlock && (VC_PREP_ROWS_IN_REGS || VC_PREP_STAGED_STATS))
    return "this prepare variant's statistics pass takes 128-row V means only (v_mean_rows=128)";
  if (p.v_merge && (VC_PREP_ROWS_IN_REGS || VC_PREP_STAGED_STATS || p.v_rank || !p.vsmooth || p.v_mean_rows != 2 * kKBlock))
    return "V-Smooth segments (v_mean_merge) need V-Smooth with 256-row means, no low-rank term and the default statistics pass";
  // (the staged statistics variant gathers through block_tokens, which follows k_order once it is set)
  if (p.v_lo_channels && (!kVLoBuild || !p.vsmooth || p.v_rank || p.v_lo_channels > kMaxVLoChannels ||
                          p.v_lo_channels > p.head_dim))
    return "the V residual's second term (v_lo_channels) needs V-Smooth, no low-rank term, at most 32 channels and the "
           "default prepare passes";
  if (p.k_lanes && (VC_PREP_ROWS_IN_REGS || VC_PREP_LEGACY_QUANTIZE || VC_PREP_STAGED_STATS || p.v_rank || p.qk_fp8 ||
                    !p.k_pair || !p.k_order))
    return "K scales per lane (k_lane_scales) need INT8 Q and K, K scales per 256 keys, no low-rank term and the default "
           "prepare passes";
  return nullptr;
}

const char* launch_prepare_stats(const PrepareParams& p, void* stream) {
  if (const char* why = prepare_refusal(p)) return why;
  return launch_half<true>(p, stream);
}

const char* launch_prepare_quantize(const PrepareParams& p, void* stream) {
  if (const char* why = prepare_refusal(p)) return why;
  return launch_half<false>(p, stream);
}

}  // namespace vc
