// Torch binding of the fused k-means grouping (grouping.cuh): tensor checks, raw pointers, the
// launch sequence of one grouping. The stream comes from Python as an integer, so this file needs
// no CUDA headers. kernels/grouping_fused.py allocates every buffer and decides the block count.
#include <torch/extension.h>

#include <optional>

#include "grouping_params.h"
#include "refusal_text.h"

namespace {

void check_buffer(const torch::Tensor& t, const torch::Tensor& v, c10::ScalarType dtype, std::vector<int64_t> shape,
                  const char* name) {
  TORCH_CHECK_VALUE(t.device() == v.device(), vc::text(name, " must be on V's device (", v.device(), ")."));
  TORCH_CHECK_VALUE(t.is_contiguous(), vc::text(name, " must be contiguous."));
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, vc::text(name, " has dtype ", t.scalar_type(), ", expected ", dtype, "."));
  TORCH_CHECK_VALUE(t.numel() == c10::multiply_integers(shape), vc::text(name, " must hold ", shape, " elements."));
}

// The checks every kernel that reads V shares: a (B, H, N, D) fp16/bf16 CUDA tensor with 16-byte aligned rows,
// head dim 64 or 128, N within int32, B * H within the grid's y dimension.
void check_v(const torch::Tensor& v) {
  TORCH_CHECK_VALUE(v.is_cuda() && v.dim() == 4, "V must be a 4-D (B, H, N, D) CUDA tensor.");
  TORCH_CHECK_VALUE(v.scalar_type() == torch::kHalf || v.scalar_type() == torch::kBFloat16, "V must be float16 or bfloat16.");
  TORCH_CHECK_VALUE(v.stride(3) == 1, "V must have a contiguous last dimension.");
  TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(v.data_ptr()) % 16 == 0 && v.stride(0) % 8 == 0 && v.stride(1) % 8 == 0 &&
                        v.stride(2) % 8 == 0,
                    "V's rows must be 16-byte aligned.");
  TORCH_CHECK_VALUE(v.size(3) == 64 || v.size(3) == 128, vc::text("head dim must be 64 or 128, got ", v.size(3), "."));
  TORCH_CHECK_VALUE(v.size(2) >= 1 && v.size(2) <= INT32_MAX, vc::text("N must be between 1 and 2^31 - 1, got ", v.size(2), "."));
  const int64_t g = v.size(0) * v.size(1);
  TORCH_CHECK_VALUE(g <= 65535, vc::text("B * H must be at most 65535 (one grid row per head), got ", g, "."));
}

void raise_on_error(const char* err, const char* what) { TORCH_CHECK(err == nullptr, vc::text(what, " launch failed: ", err)); }

// iters rounds of (assignment + sums, update), then the final assignment; tensor_cores picks the
// bf16-MMA assignment pass (bf16 V only). With `perm` given, also
// the cluster order (`chain`, else the k-means ids) and the permutation; without it only raw_labels
// and the updated centroids are outputs.
void kmeans_group(const torch::Tensor& v, torch::Tensor centroids, torch::Tensor part_sums, torch::Tensor part_counts,
                  torch::Tensor raw_labels, const std::optional<torch::Tensor>& rank,
                  const std::optional<torch::Tensor>& counts, const std::optional<torch::Tensor>& centroids_out,
                  const std::optional<torch::Tensor>& labels, const std::optional<torch::Tensor>& perm, int64_t iters,
                  bool chain, bool tensor_cores, int64_t max_shared_bytes, int64_t stream) {
  check_v(v);
  const int64_t b = v.size(0), h = v.size(1), n = v.size(2), d = v.size(3);
  TORCH_CHECK_VALUE(iters >= 0, "iters must be >= 0.");
  const int64_t g = b * h;
  TORCH_CHECK_VALUE(centroids.dim() == 3 && centroids.size(0) == g && centroids.size(2) == d,
                    "centroids must be (B*H, C, D) float32.");
  const int64_t c = centroids.size(1);
  TORCH_CHECK_VALUE(c >= 1 && c <= vc::kGroupMaxClusters && c <= n, vc::text("clusters must be between 1 and min(N, ",
                    vc::kGroupMaxClusters, "), got ", c, "."));
  TORCH_CHECK_VALUE(!tensor_cores || v.scalar_type() == torch::kBFloat16, "the tensor-core pass needs bfloat16 V.");
  TORCH_CHECK_VALUE(vc::group_pass_smem_bytes(int(d), int(c), tensor_cores) <= max_shared_bytes &&
                        vc::group_order_smem_bytes(int(d), int(c)) <= max_shared_bytes,
                    vc::text(c, " clusters at head dim ", d, " need more shared memory than this GPU's ", max_shared_bytes, " bytes."));
  // the rank before size(1), so a wrong buffer gets this sentence rather than torch's index error
  TORCH_CHECK_VALUE(part_counts.dim() == 3, "part_counts must be (B*H, parts, C) int32.");
  const int64_t parts = part_counts.size(1);
  check_buffer(centroids, v, torch::kFloat32, {g, c, d}, "centroids");
  check_buffer(part_sums, v, torch::kFloat32, {g, parts, c, d}, "part_sums");
  check_buffer(part_counts, v, torch::kInt32, {g, parts, c}, "part_counts");
  check_buffer(raw_labels, v, torch::kUInt8, {g, n}, "raw_labels");

  vc::GroupParams p{};
  p.v = v.data_ptr();
  for (int i = 0; i < 3; ++i) p.v_stride[i] = v.stride(i);
  p.centroids = centroids.data_ptr<float>();
  p.part_sums = part_sums.data_ptr<float>();
  p.part_counts = part_counts.data_ptr<int32_t>();
  p.raw_labels = raw_labels.data_ptr<uint8_t>();
  p.batch = int(b);
  p.heads = int(h);
  p.n = int(n);
  p.head_dim = int(d);
  p.clusters = int(c);
  p.parts = int(parts);
  p.input_bf16 = v.scalar_type() == torch::kBFloat16;
  p.tensor_cores = tensor_cores;
  void* s = reinterpret_cast<void*>(stream);

  for (int64_t i = 0; i < iters; ++i) {
    raise_on_error(vc::launch_group_pass(p, true, s), "k-means pass");
    raise_on_error(vc::launch_group_update(p, s), "k-means update");
  }
  raise_on_error(vc::launch_group_pass(p, false, s), "k-means final assignment");
  if (!perm.has_value()) return;

  TORCH_CHECK_VALUE(rank.has_value() && counts.has_value() && centroids_out.has_value() && labels.has_value(),
                    "the permutation needs rank, counts, centroids_out and labels buffers too.");
  check_buffer(*rank, v, torch::kInt32, {g, c}, "rank");
  check_buffer(*counts, v, torch::kInt32, {g, c}, "counts");
  check_buffer(*centroids_out, v, torch::kFloat16, {g, c, d}, "centroids_out");
  check_buffer(*labels, v, torch::kUInt8, {g, n}, "labels");
  check_buffer(*perm, v, torch::kInt32, {g, n}, "perm");
  p.rank = rank->data_ptr<int32_t>();
  p.counts = counts->data_ptr<int32_t>();
  p.centroids_out = reinterpret_cast<uint16_t*>(centroids_out->data_ptr());
  p.labels = labels->data_ptr<uint8_t>();
  p.perm = perm->data_ptr<int32_t>();
  raise_on_error(vc::launch_group_order(p, chain, s), "cluster order");
  raise_on_error(vc::launch_group_permute(p, s), "permutation");
}

// The stable permutation of stored labels (a cached grouping's reuse steps): per-part counts, then the
// permutation kernel's scatter with the labels as final ids. labels must hold ids < clusters (the
// grouping made them; kernels/grouping_fused.py only passes a CompactGrouping's own labels).
void permute_labels(const torch::Tensor& labels, torch::Tensor part_counts, torch::Tensor perm, int64_t stream) {
  TORCH_CHECK_VALUE(labels.is_cuda() && labels.dim() == 3 && labels.scalar_type() == torch::kUInt8 && labels.is_contiguous(),
                    "labels must be a contiguous (B, H, N) uint8 CUDA tensor.");
  TORCH_CHECK_VALUE(part_counts.dim() == 3, "part_counts must be (B*H, parts, C) int32.");
  const int64_t b = labels.size(0), h = labels.size(1), n = labels.size(2);
  const int64_t g = b * h, parts = part_counts.size(1), c = part_counts.size(2);
  TORCH_CHECK_VALUE(n >= 1 && n <= INT32_MAX, vc::text("N must be between 1 and 2^31 - 1, got ", n, "."));
  TORCH_CHECK_VALUE(g <= 65535, vc::text("B * H must be at most 65535 (one grid row per head), got ", g, "."));
  TORCH_CHECK_VALUE(c >= 1 && c <= vc::kGroupMaxClusters, vc::text("clusters must be between 1 and ", vc::kGroupMaxClusters, "."));
  TORCH_CHECK_VALUE(parts >= 1 && parts <= (n + vc::kGroupTileTokens - 1) / vc::kGroupTileTokens,
                    vc::text("parts must be between 1 and the number of ", vc::kGroupTileTokens, "-token tiles."));
  check_buffer(part_counts, labels, torch::kInt32, {g, parts, c}, "part_counts");
  check_buffer(perm, labels, torch::kInt32, {g, n}, "perm");
  vc::GroupParams p{};
  p.part_counts = part_counts.data_ptr<int32_t>();
  p.raw_labels = labels.data_ptr<uint8_t>();
  p.perm = perm.data_ptr<int32_t>();
  p.batch = int(b);
  p.heads = int(h);
  p.n = int(n);
  p.clusters = int(c);
  p.parts = int(parts);
  void* s = reinterpret_cast<void*>(stream);
  raise_on_error(vc::launch_group_label_counts(p, s), "label counts");
  raise_on_error(vc::launch_group_permute(p, s), "permutation");
}

// Each cluster's tokens of a label-sorted permutation in `bins` bins along the cluster's chain direction
// (kernels/grouping_within.py is the spec). perm_in must be the stable sort of labels whose per-label
// counts are `counts` (a grouping's own perm and counts: kernels/grouping_fused.py passes nothing else).
void refine_perm(const torch::Tensor& v, const torch::Tensor& perm_in, const torch::Tensor& counts,
                 const torch::Tensor& centroids, torch::Tensor keys, torch::Tensor perm_out, int64_t bins,
                 int64_t stream) {
  check_v(v);
  const int64_t b = v.size(0), h = v.size(1), n = v.size(2), d = v.size(3);
  const int64_t g = b * h;
  TORCH_CHECK_VALUE(counts.dim() == 3, "counts must be (B, H, C) int32.");
  const int64_t c = counts.size(2);
  TORCH_CHECK_VALUE(c >= 1 && c <= vc::kGroupMaxClusters, vc::text("clusters must be between 1 and ", vc::kGroupMaxClusters, "."));
  TORCH_CHECK_VALUE(bins >= 2 && bins <= vc::kGroupMaxWithinBins,
                    vc::text("bins must be between 2 and ", vc::kGroupMaxWithinBins, ", got ", bins, "."));
  check_buffer(perm_in, v, torch::kInt32, {g, n}, "perm_in");
  check_buffer(counts, v, torch::kInt32, {g, c}, "counts");
  check_buffer(centroids, v, torch::kFloat16, {g, c, d}, "centroids");
  check_buffer(keys, v, torch::kFloat32, {g, n}, "keys");
  check_buffer(perm_out, v, torch::kInt32, {g, n}, "perm_out");
  vc::RefineParams p{};
  p.v = v.data_ptr();
  for (int i = 0; i < 3; ++i) p.v_stride[i] = v.stride(i);
  p.perm_in = perm_in.data_ptr<int32_t>();
  p.counts = counts.data_ptr<int32_t>();
  p.centroids = reinterpret_cast<const uint16_t*>(centroids.data_ptr());
  p.keys = keys.data_ptr<float>();
  p.perm_out = perm_out.data_ptr<int32_t>();
  p.batch = int(b);
  p.heads = int(h);
  p.n = int(n);
  p.head_dim = int(d);
  p.clusters = int(c);
  p.bins = int(bins);
  p.input_bf16 = v.scalar_type() == torch::kBFloat16;
  raise_on_error(vc::launch_group_refine(p, reinterpret_cast<void*>(stream)), "within-cluster order");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("kmeans_group", &kmeans_group, "Fused k-means grouping of V (kernels/grouping_fused.py)");
  m.def("refine_perm", &refine_perm, "Each cluster's tokens in bins along its chain direction (kernels/grouping_within.py)");
  m.def("permute_labels", &permute_labels, "Stable permutation of a cached grouping's labels (kernels/grouping_fused.py)");
}
