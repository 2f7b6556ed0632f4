// Torch binding of the fused prepare kernels (prepare.cu): tensor checks, raw pointers, launch.
// Its own extension (vc_attention_prepare), shared by every CUDA attention backend.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/extension.h>

#include <optional>
#include <tuple>

#include "binding_checks.h"
#include "vc_constants.h"
#include "vc_params.h"

namespace {

using vc::check_cuda_contiguous;
using vc::fill_strides;
using vc::raise_on_error;

void check_input(const torch::Tensor& t, const char* name, const torch::Tensor& q) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.dim() == 4, name, " must be a 4-D CUDA tensor (B, H, N, D view).");
  TORCH_CHECK_VALUE(t.device() == q.device(), name, " must be on q's device (", q.device(), ").");
  TORCH_CHECK_VALUE(t.scalar_type() == q.scalar_type(), name, " must have q's dtype.");
  TORCH_CHECK_VALUE(t.sizes() == q.sizes(), name, " must have q's shape.");
  TORCH_CHECK_VALUE(t.stride(3) == 1, name, " must have a contiguous last dimension.");
  TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(2) % 8 == 0 && t.stride(1) % 8 == 0 &&
                        t.stride(0) % 8 == 0,
                    name, " rows must be 16-byte aligned.");
}

void run_prepare(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const std::optional<torch::Tensor>& perm,
                 torch::Tensor q_q, torch::Tensor q_scale, torch::Tensor k_q, torch::Tensor k_scale, torch::Tensor v_t,
                 torch::Tensor v_scale, torch::Tensor v_mean, const std::optional<torch::Tensor>& v_basis,
                 const std::optional<torch::Tensor>& v_low_t, const std::optional<torch::Tensor>& v_low_scale, double qk_scale,
                 bool qk_fp8, bool vsmooth, bool smooth_k, int64_t v_mean_rows, const std::optional<torch::Tensor>& v_seg_end,
                 int64_t k_scale_rows, cudaStream_t stream) {
  TORCH_CHECK_VALUE(q.scalar_type() == torch::kHalf || q.scalar_type() == torch::kBFloat16, "q must be float16 or bfloat16.");
  check_input(q, "q", q);
  check_input(k, "k", q);
  check_input(v, "v", q);
  const int64_t head_dim = q.size(3);
  TORCH_CHECK_VALUE(head_dim == 64 || head_dim == 128, "head dim must be 64 or 128, got ", head_dim, ".");
  for (const auto* t : {&q_q, &q_scale, &k_q, &k_scale, &v_t, &v_scale, &v_mean}) check_cuda_contiguous(*t, "prepared operand");
  TORCH_CHECK_VALUE(q_scale.numel() == q_q.size(0) * q_q.size(1) * q_q.size(2),
                    "q_scale must hold one scale per query row, shape (B, H, n_pad).");
  // the stats kernel's grid and the per-block K sums below are sized from it
  TORCH_CHECK_VALUE(q_q.size(2) % vc::kKBlock == 0 && k_scale.numel() == q_q.size(0) * q_q.size(1) * (q_q.size(2) / vc::kKBlock),
                    "k_scale must hold one scale per ", vc::kKBlock, "-key block, shape (B, H, n_pad / ", vc::kKBlock, ").");
  TORCH_CHECK_VALUE(v_mean_rows == vc::kKBlock || v_mean_rows == 2 * vc::kKBlock, "v_mean_rows must be ", vc::kKBlock,
                    " or ", 2 * vc::kKBlock, ", got ", v_mean_rows, ".");
  // K scales per 256 keys: the statistics pass (one block per 256-row V mean) takes each block's K extremes
  TORCH_CHECK_VALUE(k_scale_rows == vc::kKBlock || (k_scale_rows == 2 * vc::kKBlock && v_mean_rows == 2 * vc::kKBlock),
                    "k_scale_rows must be ", vc::kKBlock, ", or ", 2 * vc::kKBlock, " with v_mean_rows ", 2 * vc::kKBlock,
                    ", got k_scale_rows ", k_scale_rows, " with v_mean_rows ", v_mean_rows, ".");
  const bool k_pair = k_scale_rows == 2 * vc::kKBlock;
  TORCH_CHECK_VALUE(!k_pair || !(vc::prepare_rows_in_regs() || vc::prepare_legacy_quantize() || vc::prepare_staged_stats() ||
                                 vc::prepare_stats_prefetch()),
                    "this prepare build variant takes K scales per ", vc::kKBlock, " keys only (k_scale_rows ", k_scale_rows, ").");
  vc::PrepareParams p{};
  p.v_mean_rows = static_cast<int>(v_mean_rows);
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  fill_strides(p.q_stride, q);
  fill_strides(p.k_stride, k);
  fill_strides(p.v_stride, v);
  if (perm.has_value()) {
    check_cuda_contiguous(*perm, "perm");
    TORCH_CHECK_VALUE(perm->scalar_type() == torch::kInt32, "perm must be int32 here.");
    p.perm = perm->data_ptr<int32_t>();
  }
  const int64_t bh = q.size(0) * q.size(1);
  // V-Smooth's low-rank term: all three tensors or none
  const bool low_rank = v_basis.has_value();
  TORCH_CHECK_VALUE(low_rank == v_low_t.has_value() && low_rank == v_low_scale.has_value(),
                    "the low-rank term needs v_basis, v_low_t and v_low_scale together.");
  int64_t rank = 0;
  if (low_rank) {
    TORCH_CHECK_VALUE(vsmooth, "the low-rank V term needs V-Smooth.");
    for (const auto* t : {&*v_basis, &*v_low_t, &*v_low_scale}) check_cuda_contiguous(*t, "low-rank operand");
    rank = v_basis->size(2);
    TORCH_CHECK_VALUE(v_basis->scalar_type() == torch::kHalf && v_basis->dim() == 4 && v_basis->size(0) == q.size(0) &&
                          v_basis->size(1) == q.size(1) && v_basis->size(3) == head_dim && rank >= 1 && rank <= vc::kMaxVRank,
                      "v_basis must be float16 (B, H, rank, D) with rank 1..", vc::kMaxVRank, ".");
    TORCH_CHECK_VALUE(v_low_t->numel() == bh * vc::kVLowRows * q_q.size(2) && v_low_t->element_size() == 1,
                      "v_low_t must be one byte per element, shape (B, H, ", vc::kVLowRows, ", n_pad).");
    TORCH_CHECK_VALUE(v_low_scale->scalar_type() == torch::kFloat32 && v_low_scale->numel() == bh * rank,
                      "v_low_scale must be float32 (B, H, rank).");
  }
  // k_sum and v_amax, then one counter per head (zero bits), then the low-rank term's coefficient amax,
  // zeroed in one cudaMemsetAsync (torch::zeros' fill kernel cost ~5 us more host time before the first
  // launch); the per-block K sums need no zeroing (every block writes its own)
  auto workspace = torch::empty({2 * bh * head_dim + bh + (low_rank ? bh * vc::kMaxVRank : 0)},
                                q.options().dtype(torch::kFloat32));
  const cudaError_t zeroed = cudaMemsetAsync(workspace.data_ptr(), 0, workspace.nbytes(), stream);
  TORCH_CHECK(zeroed == cudaSuccess, "prepare: zeroing the statistics workspace failed: ", cudaGetErrorString(zeroed));
  // one slot per stats block = per K scale block (k_scale holds one scale per block)
  auto k_partial = torch::empty({smooth_k ? k_scale.numel() * head_dim : 0}, q.options().dtype(torch::kFloat32));
  p.q_q = q_q.data_ptr();
  p.q_scale = q_scale.data_ptr<float>();
  p.k_q = k_q.data_ptr();
  p.k_scale = k_scale.data_ptr<float>();
  p.v_t = static_cast<uint8_t*>(v_t.data_ptr());
  p.v_scale = v_scale.data_ptr<float>();
  p.v_mean = static_cast<uint16_t*>(v_mean.data_ptr());
  p.k_sum = workspace.data_ptr<float>();
  p.v_amax = p.k_sum + bh * head_dim;
  p.k_done = reinterpret_cast<unsigned int*>(p.v_amax + bh * head_dim);
  p.k_partial = k_partial.data_ptr<float>();
  // V-Smooth segments: each 256-row statistics block's mean and amax (D floats each), energy and segment
  torch::Tensor blk;
  if (v_seg_end.has_value()) {
    TORCH_CHECK_VALUE(vsmooth && v_mean_rows == 2 * vc::kKBlock, "V-Smooth segments need V-Smooth with ", 2 * vc::kKBlock,
                      "-row means.");
    check_cuda_contiguous(*v_seg_end, "v_seg_end");
    const int64_t nb = (q_q.size(2) + 2 * vc::kKBlock - 1) / (2 * vc::kKBlock);
    TORCH_CHECK_VALUE(v_seg_end->numel() == bh * (q_q.size(2) / vc::kKBlock) && v_seg_end->element_size() == 1,
                      "v_seg_end must be one byte per 128-row slot, shape (B, H, n_pad / 128).");
    blk = torch::empty({bh * nb * (2 * head_dim + 2)}, q.options().dtype(torch::kFloat32));
    p.blk_mean = blk.data_ptr<float>();
    p.blk_amax = p.blk_mean + bh * nb * head_dim;
    p.blk_energy = p.blk_amax + bh * nb * head_dim;
    p.blk_seg_first = reinterpret_cast<int*>(p.blk_energy + bh * nb);
    p.v_seg_end = static_cast<uint8_t*>(v_seg_end->data_ptr());
    p.v_merge = true;
  }
  torch::Tensor k_ext;
  if (k_pair) {
    TORCH_CHECK_VALUE(!low_rank, "K scales per ", 2 * vc::kKBlock, " keys take no low-rank V term.");
    const int64_t nb = (q_q.size(2) + 2 * vc::kKBlock - 1) / (2 * vc::kKBlock);
    k_ext = torch::empty({2 * bh * nb * head_dim}, q.options().dtype(torch::kFloat32));
    p.k_blk_max = k_ext.data_ptr<float>();
    p.k_blk_min = p.k_blk_max + bh * nb * head_dim;
    p.k_pair = true;
  }
  if (low_rank) {
    p.v_basis = static_cast<const uint16_t*>(v_basis->data_ptr());
    p.v_low_t = static_cast<uint8_t*>(v_low_t->data_ptr());
    p.v_low_scale = v_low_scale->data_ptr<float>();
    p.c_amax = reinterpret_cast<float*>(p.k_done + bh);
    p.v_rank = static_cast<int>(rank);
  }
  p.batch = q.size(0);
  p.heads = q.size(1);
  p.n = q.size(2);
  p.n_pad = q_q.size(2);
  p.head_dim = head_dim;
  p.qk_scale = static_cast<float>(qk_scale);
  p.input_bf16 = q.scalar_type() == torch::kBFloat16;
  p.qk_fp8 = qk_fp8;
  p.vsmooth = vsmooth;
  p.smooth_k = smooth_k;
  raise_on_error(vc::launch_prepare(p, stream), "prepare");
}

using Operands = std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor,
                            torch::Tensor, std::optional<torch::Tensor>, std::optional<torch::Tensor>,
                            std::optional<torch::Tensor>>;

// The operand contract (kernels/operands.py) allocated here and filled on q's device and current stream:
// one binding call per attention call. Allocated from Python, one tensor at a time, they were part of the
// host time a short call pays before its first launch (docs/kernel-notes.md section 25).
// v_basis (B, H, rank, D) float16 turns the low-rank term on (then v_low_t and v_low_scale are returned);
// v_merge the V-Smooth segments (VCConfig.v_mean_merge: then v_seg_end is returned, last).
Operands prepare(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const std::optional<torch::Tensor>& perm,
                 const std::optional<torch::Tensor>& v_basis, double qk_scale, bool qk_fp8, bool vsmooth, bool smooth_k,
                 int64_t v_mean_rows, bool v_merge, int64_t k_scale_rows) {
  TORCH_CHECK_VALUE(q.is_cuda() && q.dim() == 4, "q must be a 4-D CUDA tensor (B, H, N, D view).");
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t b = q.size(0), h = q.size(1), n = q.size(2), d = q.size(3);
  const int64_t n_pad = (n + vc::kKBlock - 1) / vc::kKBlock * vc::kKBlock;
  const auto on_q = q.options();
  const auto f32 = on_q.dtype(torch::kFloat32);
  const auto e4m3 = on_q.dtype(torch::kFloat8_e4m3fn);
  auto q_q = torch::empty({b, h, n_pad, d}, on_q.dtype(qk_fp8 ? torch::kFloat8_e4m3fn : torch::kChar));
  auto k_q = torch::empty({b, h, n_pad, d}, q_q.options());
  auto q_scale = torch::empty({b, h, n_pad}, f32);
  auto k_scale = torch::empty({b, h, n_pad / vc::kKBlock}, f32);
  auto v_t = torch::empty({b, h, d, n_pad}, e4m3);
  auto v_scale = torch::empty({b, h, d}, f32);
  // per-channel V: the kernels' mean restore reads zeros (operands.py)
  const std::vector<int64_t> mean_shape{b, h, n_pad / vc::kKBlock, d};
  auto v_mean = vsmooth ? torch::empty(mean_shape, on_q.dtype(torch::kHalf)) : torch::zeros(mean_shape, on_q.dtype(torch::kHalf));
  std::optional<torch::Tensor> v_low_t, v_low_scale;
  if (v_basis.has_value()) {
    TORCH_CHECK_VALUE(v_basis->dim() == 4, "v_basis must be (B, H, rank, D).");
    v_low_t = torch::empty({b, h, vc::kVLowRows, n_pad}, e4m3);
    v_low_scale = torch::empty({b, h, v_basis->size(2)}, f32);
  }
  std::optional<torch::Tensor> v_seg_end;
  if (v_merge) v_seg_end = torch::empty({b, h, n_pad / vc::kKBlock}, on_q.dtype(torch::kByte));
  run_prepare(q, k, v, perm, q_q, q_scale, k_q, k_scale, v_t, v_scale, v_mean, v_basis, v_low_t, v_low_scale, qk_scale,
              qk_fp8, vsmooth, smooth_k, v_mean_rows, v_seg_end, k_scale_rows,
              c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
  return {q_q, q_scale, k_q, k_scale, v_t, v_scale, v_mean, v_low_t, v_low_scale, v_seg_end};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "VC-Attention fused prepare: q, k, v (+perm) -> the quantized operands of the attention kernels.";
  m.def("prepare", &prepare, "q, k, v (+perm, +v_basis) -> the quantized operands (q_q, q_scale, k_q, k_scale, v_t, v_scale, "
        "v_mean, v_low_t, v_low_scale, v_seg_end), on q's device and current stream; k_scale_rows 256 (with v_mean_rows 256) "
        "stores each 256-key block's K scale in both of its 128-key slots");
  m.def("rows_in_regs", &vc::prepare_rows_in_regs, "1 if this build runs the register-staged kernels (VC_PREP_ROWS_IN_REGS)");
  m.def("legacy_quantize", &vc::prepare_legacy_quantize,
        "1 if this build runs prepare.cuh's quantize kernel instead of the staged one (VC_PREP_LEGACY_QUANTIZE)");
  m.def("staged_stats", &vc::prepare_staged_stats,
        "1 if this build runs prepare_staged.cuh's statistics kernel instead of prepare.cuh's (VC_PREP_STAGED_STATS)");
  m.def("stats_prefetch", &vc::prepare_stats_prefetch,
        "1 if this build's statistics kernel loads its permutation indices first (VC_PREP_STATS_PREFETCH)");
}
