// Launch of one attention kernel instantiation (included by the per-head-dim .cu files, which
// each compile their own head dim in parallel).
#pragma once
#include "attn_mma.cuh"

namespace vc {

template <int D, bool kQkFp8, bool kExpCast, bool kVSmooth>
cudaError_t launch_attn_mma_variant(const AttnParams& p, cudaStream_t stream) {
  auto* kernel = attn_mma_kernel<D, kQkFp8, kExpCast, kVSmooth>;
  constexpr int kSmem = AttnSmem<D>::kBytes;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.n + kQBlock - 1) / kQBlock, p.batch * p.heads);
  kernel<<<grid, kAttnThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

// All 8 (QK format, P encoding, V format) variants of head dim D.
template <int D>
cudaError_t launch_attn_mma_dim(const AttnParams& p, cudaStream_t stream) {
  if (p.qk_fp8) {
    if (p.expcast) return p.vsmooth ? launch_attn_mma_variant<D, true, true, true>(p, stream) : launch_attn_mma_variant<D, true, true, false>(p, stream);
    return p.vsmooth ? launch_attn_mma_variant<D, true, false, true>(p, stream) : launch_attn_mma_variant<D, true, false, false>(p, stream);
  }
  if (p.expcast) return p.vsmooth ? launch_attn_mma_variant<D, false, true, true>(p, stream) : launch_attn_mma_variant<D, false, true, false>(p, stream);
  return p.vsmooth ? launch_attn_mma_variant<D, false, false, true>(p, stream) : launch_attn_mma_variant<D, false, false, false>(p, stream);
}

cudaError_t launch_attn_mma_d64(const AttnParams& p, cudaStream_t stream);
cudaError_t launch_attn_mma_d128(const AttnParams& p, cudaStream_t stream);

}  // namespace vc
