// Attention kernels for head dim 128 (one file per head dim so the JIT compiles them in parallel).
#include "attn_mma_launch.cuh"

namespace vc {
cudaError_t launch_attn_mma_d128(const AttnParams& p, cudaStream_t stream, bool k_lanes) {
  return launch_attn_mma_dim<128>(p, stream, k_lanes);
}
}  // namespace vc
