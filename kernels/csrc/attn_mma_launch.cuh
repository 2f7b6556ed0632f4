// Launch of one attention kernel instantiation (included by the per-head-dim .cu files, which
// each compile their own head dim in parallel).
#pragma once
#include "attn_mma.cuh"
#include "attn_mma_wide.cuh"

// Which work split the build runs (timed side by side by bench/mma_variants.py):
// 0 = 16 query rows per warp, 64-row CTAs (attn_mma.cuh); 1 = the FlashAttention-2 layout,
// 32 rows per warp, 128-row CTAs, 64-key cp.async ring (attn_mma_wide.cuh).
#ifndef VC_MMA_WIDE
#define VC_MMA_WIDE 0
#endif

namespace vc {

// if constexpr: only the selected layout is instantiated (and compiled)
template <int D, bool kQkFp8, bool kExpCast, bool kVSmooth, bool kLanes = false>
inline void (*attn_kernel_of_build())(const AttnParams) {
  if constexpr (kLanes) {  // K scales per lane: the wide layout's own instantiations (launch_attn_mma_dim asks only there)
    return attn_mma_wide_kernel<D, kQkFp8, kExpCast, kVSmooth, true>;
  } else if constexpr (VC_MMA_WIDE) {
#if VC_MMA_D64_BOUND
    // the head-dim-64 kernels with a CTAs-per-SM bound: all of them (VC_MMA_D64_MIN_BLOCKS) or the V-Smooth ones
    if constexpr (D == 64 && (VC_MMA_D64_MIN_BLOCKS || kVSmooth)) {
      return attn_mma_wide_kernel_occupied<D, kQkFp8, kExpCast, kVSmooth>;
    } else {
      return attn_mma_wide_kernel<D, kQkFp8, kExpCast, kVSmooth>;
    }
#else
    return attn_mma_wide_kernel<D, kQkFp8, kExpCast, kVSmooth>;
#endif
  } else {
    return attn_mma_kernel<D, kQkFp8, kExpCast, kVSmooth>;
  }
}

template <int D, bool kQkFp8, bool kExpCast, bool kVSmooth, bool kLanes = false>
cudaError_t launch_attn_mma_variant(const AttnParams& p, cudaStream_t stream) {
  auto* kernel = attn_kernel_of_build<D, kQkFp8, kExpCast, kVSmooth, kLanes>();
  // the wide kernel's own shared-memory layout (its V form and ring depth are per kernel)
  constexpr int kSmem = VC_MMA_WIDE ? AttnMmaWide<D, kQkFp8, kExpCast, kVSmooth, kLanes>::Smem::kBytes : AttnSmem<D>::kBytes;
  constexpr int kRows = VC_MMA_WIDE ? kWideRows : kQBlock;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.n + kRows - 1) / kRows, p.batch * p.heads);
  kernel<<<grid, kAttnThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

// All 8 (QK format, P encoding, V format) variants of head dim D.
template <int D>
cudaError_t launch_attn_mma_dim(const AttnParams& p, cudaStream_t stream, bool k_lanes) {
  // K scales per lane: INT8, V-Smooth, head dim 128, wide builds (the binding refuses the rest with a sentence)
  if constexpr (D == 128 && VC_MMA_WIDE) {
    if (k_lanes && !p.qk_fp8 && p.vsmooth)
      return p.expcast ? launch_attn_mma_variant<D, false, true, true, true>(p, stream)
                       : launch_attn_mma_variant<D, false, false, true, true>(p, stream);
  }
  if (k_lanes) return cudaErrorInvalidValue;
  if (p.qk_fp8) {
    if (p.expcast) return p.vsmooth ? launch_attn_mma_variant<D, true, true, true>(p, stream) : launch_attn_mma_variant<D, true, true, false>(p, stream);
    return p.vsmooth ? launch_attn_mma_variant<D, true, false, true>(p, stream) : launch_attn_mma_variant<D, true, false, false>(p, stream);
  }
  if (p.expcast) return p.vsmooth ? launch_attn_mma_variant<D, false, true, true>(p, stream) : launch_attn_mma_variant<D, false, true, false>(p, stream);
  return p.vsmooth ? launch_attn_mma_variant<D, false, false, true>(p, stream) : launch_attn_mma_variant<D, false, false, false>(p, stream);
}

cudaError_t launch_attn_mma_d64(const AttnParams& p, cudaStream_t stream, bool k_lanes);
cudaError_t launch_attn_mma_d128(const AttnParams& p, cudaStream_t stream, bool k_lanes);

}  // namespace vc
