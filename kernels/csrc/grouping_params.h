// Plain C++ parameter blocks of the fused k-means grouping (grouping.cuh), shared by the torch
// binding (host compiler) and the CUDA launchers. Torch-free and CUDA-free.
#pragma once
#include <cstdint>

namespace vc {

// Shared-memory sizes, mirrored by kernels/grouping_fused.py (which decides whether the fused path
// fits the GPU). Clusters are padded to a multiple of kGroupChunk for the distance tile.
constexpr int kGroupTileTokens = 64;   // tokens per tile of the assignment pass
constexpr int kGroupChunk = 64;        // centroids per register tile (8 lanes x 8 centroids)
constexpr int kGroupMaxClusters = 256; // labels are uint8
constexpr int kPermThreads = 256;      // tokens per step of the permutation scatter
// Tensor-core pass: a float32 centroid is the sum of three bf16 terms (8 + 8 + 8 significant bits,
// as many as float32 has), so the bf16 MMA distances keep the float32 path's precision.
constexpr int kGroupSplits = 3;
// Within-cluster order (grouping_refine.cuh): bins per cluster at most (per-block shared counters;
// kernels/grouping_within.py MAX_BINS), threads per block (one block per cluster and head).
constexpr int kGroupMaxWithinBins = 32;
constexpr int kRefineThreads = 256;

constexpr int group_padded_clusters(int clusters) { return (clusters + kGroupChunk - 1) / kGroupChunk * kGroupChunk; }

// FP32 pass: cs float [Cp][D+4] + xs 16-bit [64][D+4];
// tensor-core pass: cs bf16 [kGroupSplits][Cp][D] + xs 16-bit [64][D] (swizzled, no padding: fits sm_89's 99 KB);
// both: + sums float [Cp][D] + norms, counts [Cp] + labels [64]
constexpr int64_t group_pass_smem_bytes(int head_dim, int clusters, bool tensor_cores) {
  const int64_t cp = group_padded_clusters(clusters);
  const int64_t tiles = tensor_cores ? kGroupSplits * cp * head_dim * 2 + int64_t(kGroupTileTokens) * head_dim * 2
                                     : cp * (head_dim + 4) * 4 + int64_t(kGroupTileTokens) * (head_dim + 4) * 2;
  return tiles + cp * head_dim * 4 + cp * 8 + kGroupTileTokens * 4;
}

// centroids float [C][D+1] + four per-cluster arrays + the weighted mean [D] + reduction scratch
// (+ the 64 x 64 Gram matrix of the one-warp chain when built with VC_GROUP_ORDER_GRAM, grouping.cuh)
#ifndef VC_GROUP_ORDER_GRAM
#define VC_GROUP_ORDER_GRAM 1  // 0 (variant "order-direct"): the one-warp chain computes each dot product itself
#endif
constexpr int64_t group_order_smem_bytes(int head_dim, int clusters) {
  return int64_t(clusters) * (head_dim + 1) * 4 + int64_t(clusters) * 16 + int64_t(head_dim) * 4 + 64 * 4 +
         (VC_GROUP_ORDER_GRAM && clusters <= 64 ? 64 * 64 * 4 : 0);
}

// One grouping of V (B,H,N,D) fp16/bf16 with any (b,h,n) strides and a contiguous last dim.
// Groups g = b*H + h. Tokens of group g are split into `parts` contiguous ranges of whole tiles,
// one per block of the assignment pass: part p covers tiles [p*T/parts, (p+1)*T/parts).
struct GroupParams {
  const void* v;
  int64_t v_stride[3];     // elements, for b, h, n
  float* centroids;        // (G,C,D) float32, updated in place
  float* part_sums;        // (G,parts,C,D) float32 per-block cluster sums
  int32_t* part_counts;    // (G,parts,C) per-block cluster counts
  uint8_t* raw_labels;     // (G,N) k-means ids of the last assignment (written by the final pass)
  int32_t* rank;           // (G,C) new id of each k-means cluster (chain order or identity; nullptr: identity)
  int32_t* counts;         // (G,C) tokens per cluster, in the new ids
  uint16_t* centroids_out; // (G,C,D) fp16 centroids in the new ids
  uint8_t* labels;         // (G,N) labels in the new ids (nullptr: not written)
  int32_t* perm;           // (G,N) stable sort by new label: perm[i] = source token of slot i
  int batch, heads, n, head_dim, clusters, parts;
  bool input_bf16;
  bool tensor_cores;  // bf16 V only: distances by bf16 MMA (group_pass_tc_kernel)
};

// The within-cluster order of a grouping (grouping_refine.cuh; the spec is kernels/grouping_within.py):
// perm_in sorted by label (stable), perm_out the same clusters with each one's tokens stably sorted by
// their bin along the cluster's chain direction. One block per (cluster, group).
struct RefineParams {
  const void* v;
  int64_t v_stride[3];        // elements, for b, h, n
  const int32_t* perm_in;     // (G,N) stable by label
  const int32_t* counts;      // (G,C) tokens per label
  const uint16_t* centroids;  // (G,C,D) fp16 centroids in the labels' ids
  float* keys;                // (G,N) scratch: the key of the token at each slot of perm_in
  int32_t* perm_out;          // (G,N)
  int batch, heads, n, head_dim, clusters, bins;
  bool input_bf16;
};

// Launchers (grouping.cu). Return a CUDA error string or nullptr on success.
// One assignment pass over V: accumulate=true sums each cluster's tokens (an iteration),
// false writes raw_labels and counts only (the final assignment).
const char* launch_group_pass(const GroupParams& p, bool accumulate, void* stream);
// New centroids = per-block sums / counts; an empty cluster keeps its centroid.
const char* launch_group_update(const GroupParams& p, void* stream);
// Cluster totals, chain order (or identity), counts and fp16 centroids in the new ids.
const char* launch_group_order(const GroupParams& p, bool chain, void* stream);
// Labels in the new ids and the stable counting-sort permutation (rank == nullptr: raw_labels are
// already the final ids; labels == nullptr: not written).
const char* launch_group_permute(const GroupParams& p, void* stream);
// part_counts of stored labels (raw_labels), for launch_group_permute on a cached grouping.
const char* launch_group_label_counts(const GroupParams& p, void* stream);
// Each cluster's tokens in bins along its chain direction (RefineParams).
const char* launch_group_refine(const RefineParams& p, void* stream);

}  // namespace vc
