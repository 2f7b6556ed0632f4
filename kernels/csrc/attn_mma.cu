// Entry point of the portable attention kernel: head-dim dispatch and error reporting.
#include "attn_mma_launch.cuh"

namespace vc {

const char* launch_attn_mma(const AttnParams& p, void* stream, bool k_lanes) {
  const auto s = static_cast<cudaStream_t>(stream);
  const cudaError_t err = p.head_dim == 64 ? launch_attn_mma_d64(p, s, k_lanes) : launch_attn_mma_d128(p, s, k_lanes);
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

int attn_mma_cta_rows() { return VC_MMA_WIDE ? kWideRows : kQBlock; }

#ifndef VC_MMA_MEAN_SCALED
#define VC_MMA_MEAN_SCALED 0
#endif
static_assert(!VC_MMA_MEAN_SCALED || VC_MMA_WIDE, "VC_MMA_MEAN_SCALED is an option of the wide layout only");
int attn_mma_mean_scaled() { return VC_MMA_MEAN_SCALED; }

}  // namespace vc
