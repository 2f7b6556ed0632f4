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

static_assert(!VC_MMA_V_F16 || VC_MMA_WIDE, "VC_MMA_V_F16 is an option of the wide layout only");
int attn_mma_v_f16() { return VC_MMA_V_F16; }
bool attn_mma_v_f16_kernel(int head_dim, bool qk_fp8, bool vsmooth) { return v_f16_kernel(head_dim, qk_fp8, vsmooth); }

// One thread per 16 keys of one V^T row d: word w of the codes holds keys 4w..4w+3; its f16x2 of keys 4w, 4w+1 goes to
// position 2w of the 16-key group, of keys 4w+2, 4w+3 to position 8+2w (two 16-byte units of 8 keys; with
// VC_MMA_P_ALU_UNPACK keys 4w, 4w+2 and 4w+1, 4w+3). The units land
// where attn_mma_wide.cuh's f16 V tile has them: chunk (64 keys) after chunk, row d of its (D, 64) block, unit u at
// u ^ (d & 7) (VC_MMA_V_F16; kernels/mma_v_f16.py is the same map in torch)
template <int D>
__global__ void v_codes_to_f16_kernel(const uint4* __restrict__ codes, uint4* __restrict__ out, int64_t n16, int n_pad) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n16) return;
  const int groups = n_pad / 16;                         // 16-key groups per row
  const int64_t row = i / groups;                        // (bh, d)
  const int key16 = int(i % groups), d = int(row % D);
  const int64_t bh = row / D;
  const int chunk = key16 / 4, u = 2 * (key16 % 4);      // 8-key units u, u + 1 of the chunk's row d
  const uint4 c = codes[i];
  const uint32_t w[4] = {c.x, c.y, c.z, c.w};
  uint32_t lo[4], hi[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // VC_MMA_P_ALU_UNPACK pairs the keys (4w, 4w+2) / (4w+1, 4w+3): bytes reordered 0, 2, 1, 3 first
    e4m3x4_to_f16x2x2(VC_MMA_P_ALU_UNPACK ? __byte_perm(w[j], 0, 0x3120) : w[j], lo[j], hi[j]);
  }
  uint4* block_row = out + ((bh * (n_pad / 64) + chunk) * D + d) * 8;  // 8 units of 16 bytes per row of a block
  block_row[u ^ (d & 7)] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  block_row[(u + 1) ^ (d & 7)] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
}

const char* launch_v_codes_to_f16(const void* codes, void* out, int64_t n16, int head_dim, int n_pad, void* stream) {
  if (n16 > 0) {
    constexpr int kThreads = 256;
    const unsigned blocks = unsigned((n16 + kThreads - 1) / kThreads);
    const auto s = static_cast<cudaStream_t>(stream);
    const auto* src = static_cast<const uint4*>(codes);
    auto* dst = static_cast<uint4*>(out);
    if (head_dim == 64) {
      v_codes_to_f16_kernel<64><<<blocks, kThreads, 0, s>>>(src, dst, n16, n_pad);
    } else {
      v_codes_to_f16_kernel<128><<<blocks, kThreads, 0, s>>>(src, dst, n16, n_pad);
    }
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace vc
