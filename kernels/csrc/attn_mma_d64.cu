// Attention kernels for head dim 64 (one file per head dim so the JIT compiles them in parallel).
#include "attn_mma_launch.cuh"

namespace vc {
cudaError_t launch_attn_mma_d64(const AttnParams& p, cudaStream_t stream, bool k_lanes) {
  return launch_attn_mma_dim<64>(p, stream, k_lanes);
}
}  // namespace vc
