// Plain C++ parameter blocks shared by the torch bindings (host compiler) and the CUDA launchers.
// Torch-free and CUDA-free so both sides can include it.
#pragma once
#include <cstdint>

namespace vc {

constexpr int kMaxVLoChannels = 32;  // PrepareParams.v_lo_channels: the largest of kernels/config.py V_LO_CHANNELS

// Fused preprocessing: q, k, v (B,H,N,D) fp16/bf16 views with any (b,h,n) strides and a contiguous
// last dim -> the operand contract of kernels/prepare.py (PreparedOperands).
struct PrepareParams {
  const void* q;
  const void* k;
  const void* v;
  int64_t q_stride[3];  // elements, for b, h, n
  int64_t k_stride[3];
  int64_t v_stride[3];
  const int32_t* perm;  // (B,H,N) contiguous slot -> source token, or nullptr for the identity
  void* q_q;            // (B,H,n_pad,D) int8 or e4m3
  float* q_scale;       // (B,H,n_pad): one scale per query row, 0 for padded rows
  void* k_q;            // (B,H,n_pad,D)
  float* k_scale;       // (B,H,n_pad/128), with k_lanes (B,H,n_pad/128,4)
  uint8_t* v_t;         // (B,H,D,n_pad) e4m3
  float* v_scale;       // (B,H,D)
  uint16_t* v_mean;     // (B,H,n_pad/128,D) fp16 (written only for vsmooth)
  float* k_sum;         // workspace (B,H,D), written by the last stats block of each head
  float* v_amax;        // workspace (B,H,D), zeroed by the caller
  float* k_partial;     // workspace (B,H,n_pad/128,D): each stats block's K column sums
  unsigned int* k_done; // workspace (B,H), zeroed by the caller: stats blocks of the head done
  // V-Smooth's low-rank term (v_rank > 0; prepare_lowrank.cuh), else unused
  const uint16_t* v_basis;  // (B,H,v_rank,D) fp16 W
  uint8_t* v_low_t;         // (B,H,kVLowRows,n_pad) e4m3: parity ones rows, then the coefficient codes
  float* v_low_scale;       // (B,H,v_rank)
  float* c_amax;            // workspace (B,H,kMaxVRank), zeroed by the caller: amax |A_k|
  // V-Smooth segments (VCConfig.v_mean_merge, v_mean_rows 256; prepare_segments_kernel): per 256-row block
  // its float32 mean, per-channel residual amax and residual energy (workspace, every block writes its
  // own), then the segment ends (output)
  float* blk_mean;      // (B,H,nb,D), nb = ceil(n_pad / 256)
  float* blk_amax;      // (B,H,nb,D)
  float* blk_energy;    // (B,H,nb)
  int* blk_seg_first;   // (B,H,nb): each block's segment's first block (prepare_segments_kernel's own)
  uint8_t* v_seg_end;   // (B,H,n_pad/128)
  // K scales per 256 keys (VCConfig.k_scale_rows 256): each statistics block's per-channel max and min of K
  // (workspace; one block per K scale with 256-row means, two with 128-row means, which k_pair_amax combines), from
  // which the quantize pass takes the smoothed K's amax
  float* k_blk_max;     // (B,H,nb,D)
  float* k_blk_min;     // (B,H,nb,D)
  bool k_pair;
  // K scales per MMA lane (VCConfig.k_lane_scales; prepare_k_lanes.cuh): k_scale is then (B,H,n_pad/128,4) and the keys
  // of each full 128-key block are in lane order; k_order (B,H,n_pad) holds each position's source row within its
  // block (workspace written by the K lanes kernel, read by the quantize pass's V gather; nullptr otherwise)
  bool k_lanes;
  uint8_t* k_order;
  bool v_merge;
  int v_rank;
  int v_mean_rows;      // V-Smooth: rows per block mean, 128 or 256 (one statistics block each; v_mean keeps one mean per 128 rows)
  int batch, heads, n, n_pad, head_dim;
  float qk_scale;       // sm_scale * log2(e)
  bool input_bf16, qk_fp8, vsmooth, smooth_k;
  // V-Smooth's residual with a second E4M3 term on v_lo_channels channels per head (VCConfig.v_lo_channels;
  // prepare_v_lo.cuh), 0: none. Last in the struct, so the other kernels' parameter offsets stay as they were.
  int v_lo_channels;
  int32_t* v_lo_sel;      // (B,H,v_lo_channels) output: the chosen channels, ascending
  uint8_t* v_lo_t;        // (B,H,v_lo_channels,n_pad) e4m3 output: row i is channel v_lo_sel[i]'s second term
  float* lo_energy;       // workspace (B,H,statistics blocks,D): each statistics block's residual energy per channel
};

// Attention on prepared operands; out is (B,H,N,D) addressed through strides (either layout).
struct AttnParams {
  const void* q_q;
  const float* q_scale;
  const void* k_q;
  const float* k_scale;
  const uint8_t* v_t;
  const float* v_scale;
  const uint16_t* v_mean;  // fp16 mean, or float32 mean / v_scale in a VC_MMA_MEAN_SCALED build
  // V-Smooth segments (VCConfig.v_mean_merge; v_mean equal over each segment's tiles): (B,H,n_pad/128) uint8,
  // 1 on each segment's last tile; the wide kernel's per-tile restore then runs only there. nullptr: every tile
  const uint8_t* v_seg_end;
  void* out;
  int64_t o_stride[3];  // elements, for b, h, n
  float* lse;           // (B,H,N) natural-log log-sum-exp, or nullptr
  int batch, heads, n, n_pad, head_dim;
  bool out_bf16, qk_fp8, expcast, vsmooth;
  // (K scales per MMA lane are the launcher's argument, not a field: a kernel learns them from its template flag, and
  // one more field here moved ptxas's spills in every portable kernel, e.g. sm_90a speed 32 -> 112 B: section 34)
};

// The Hopper library's C entry (sm90_launch.cu: vc_sm90_forward_all) and its error text, as the prepare
// extension calls them through addresses the sm90 extension hands out (prepare_attend in prepare_binding.cpp:
// one binding call for the prepare and the attention of a call); sm90_binding.cpp static_asserts that the
// entry has this type, so the two JIT builds cannot disagree on it.
using Sm90ForwardFn = int (*)(const void* q_q, const float* q_scale, const void* k_q, const float* k_scale,
                              const void* v_t, const float* v_scale, const void* v_mean, const void* v_low_t,
                              const void* v_low_basis, const float* v_low_scale, int v_rank, void* out, int batch,
                              int heads, int n, int n_pad, int head_dim, long long out_stride_b, long long out_stride_h,
                              long long out_stride_n, int expcast, int vsmooth, int out_bf16, void* stream,
                              const void* v_seg_end, const void* v_lo_t, const int* v_lo_sel, int v_lo_rows,
                              int mixed);
using Sm90ErrorFn = const char* (*)();

// Launchers (prepare.cu, attn_mma.cu). Return a CUDA error string or nullptr on success.
// The prepare in two halves: the statistics pass (writes the workspace and v_mean; reads no other operand
// pointer), then the segments (v_mean, v_seg_end) and the quantize pass (every other operand). Each returns the refusal of
// prepare_refusal (a variant or a configuration this build does not run) before launching anything.
const char* prepare_refusal(const PrepareParams& p);
const char* launch_prepare_stats(const PrepareParams& p, void* stream);
const char* launch_prepare_quantize(const PrepareParams& p, void* stream);
// 1: this prepare build runs prepare_regs.cuh's kernels (VC_PREP_ROWS_IN_REGS), 0: prepare.cuh's.
int prepare_rows_in_regs();
// 1: this prepare build's quantize pass is prepare.cuh's (VC_PREP_LEGACY_QUANTIZE), 0: prepare_staged.cuh's.
int prepare_legacy_quantize();
// 1: this prepare build's statistics pass is prepare_staged.cuh's (VC_PREP_STAGED_STATS), 0: prepare.cuh's.
int prepare_staged_stats();
// 1 if the statistics kernel loads its permutation indices first (VC_PREP_STATS_PREFETCH, prepare.cuh)
int prepare_stats_prefetch();
// k_lanes (VCConfig.k_lane_scales): k_scale is (B,H,n_pad/128,4), one per (tile, quad lane); the wide layout's INT8
// V-Smooth head-dim-128 kernels take them (the binding refuses the rest)
const char* launch_attn_mma(const AttnParams& p, void* stream, bool k_lanes = false);
// Query rows per CTA of the attention kernel this build runs (tells the build-time variants apart).
int attn_mma_cta_rows();
// 1: the build takes v_mean as float32 mean / v_scale (VC_MMA_MEAN_SCALED), 0: as the fp16 mean.
int attn_mma_mean_scaled();
// VC_MMA_V_F16: 0 every kernel takes V^T as the E4M3 codes; 1 every kernel as float16 values of the codes, keys
// permuted within each 16; 2 the head-dim-128 INT8 V-Smooth kernels in f16, the others the codes.
int attn_mma_v_f16();
// Whether the kernel for this head dim, QK format and V mode takes V^T in float16 (attn_mma_wide.cuh v_f16_kernel).
bool attn_mma_v_f16_kernel(int head_dim, bool qk_fp8, bool vsmooth);
// V^T codes (B, H, head_dim, n_pad), n16 = numel / 16 -> their f16 values as VC_MMA_V_F16 reads them (per 64-key chunk a
// swizzled (head_dim, 64) block, keys permuted within each 16); nullptr or the CUDA error
const char* launch_v_codes_to_f16(const void* codes, void* out, int64_t n16, int head_dim, int n_pad, void* stream);

}  // namespace vc
