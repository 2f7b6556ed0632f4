// Torch binding of the portable mma.sync attention kernel: tensor checks, raw pointers, launch.
// The kernels themselves are torch-free (vc_params.h); the stream comes from Python as an integer
// (torch.cuda.current_stream().cuda_stream); the only CUDA header is the device guard's.
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <optional>

#include "binding_checks.h"
#include "refusal_text.h"
#include "vc_constants.h"
#include "vc_params.h"

namespace {

using vc::check_cuda_contiguous;
using vc::fill_strides;
using vc::raise_on_error;

void attention(const torch::Tensor& q_q, const torch::Tensor& q_scale, const torch::Tensor& k_q, const torch::Tensor& k_scale,
               const torch::Tensor& v_t, const torch::Tensor& v_scale, const torch::Tensor& v_mean, torch::Tensor out,
               const std::optional<torch::Tensor>& lse, int64_t n, bool qk_fp8, bool expcast, bool vsmooth, int64_t stream,
               const std::optional<torch::Tensor>& v_seg_end) {
  for (const auto* t : {&q_q, &q_scale, &k_q, &k_scale, &v_t, &v_scale, &v_mean}) check_cuda_contiguous(*t, "prepared operand");
  TORCH_CHECK_VALUE(out.is_cuda() && out.dim() == 4 && out.stride(3) == 1, "out must be a 4-D CUDA (B, H, N, D) view with a contiguous last dim.");
  const c10::cuda::CUDAGuard guard(out.device());  // the launch goes to out's GPU whatever the current one
  TORCH_CHECK_VALUE(out.scalar_type() == torch::kHalf || out.scalar_type() == torch::kBFloat16, "out must be float16 or bfloat16.");
  // the rank first, so a wrong operand gets this sentence rather than torch's index error on size(3)
  TORCH_CHECK_VALUE(q_q.dim() == 4, "q_q must be 4-D (B, H, n_pad, D).");
  const int64_t head_dim = q_q.size(3);
  TORCH_CHECK_VALUE(head_dim == 64 || head_dim == 128, vc::text("head dim must be 64 or 128, got ", head_dim, "."));
  TORCH_CHECK_VALUE(q_scale.numel() == q_q.size(0) * q_q.size(1) * q_q.size(2),
                    "q_scale must hold one scale per query row, shape (B, H, n_pad).");
  // the mean operand's form is the build's (backend_mma.mean_operand converts it for VC_MMA_MEAN_SCALED)
  const bool mean_scaled = vc::attn_mma_mean_scaled() != 0;
  TORCH_CHECK_VALUE(!vsmooth || v_mean.scalar_type() == (mean_scaled ? torch::kFloat32 : torch::kHalf),
                    vc::text("v_mean must be ", mean_scaled ? "float32 mean / v_scale (backend_mma.mean_operand)" : "the float16 mean",
                    " for this build, got ", v_mean.scalar_type(), "."));
  // V's form is the kernel's (backend_mma.v_f16_operand converts the codes where VC_MMA_V_F16 asks for f16)
  const bool v_f16 = vc::attn_mma_v_f16_kernel(int(head_dim), qk_fp8, vsmooth);
  TORCH_CHECK_VALUE(v_f16 ? v_t.scalar_type() == torch::kHalf : v_t.element_size() == 1,
                    vc::text("v_t must be ", v_f16 ? "float16 values of the E4M3 codes (backend_mma.v_f16_operand)" : "the E4M3 codes",
                    " for this build, got ", v_t.scalar_type(), "."));
  TORCH_CHECK_VALUE(v_t.numel() == q_q.numel(), "v_t must be (B, H, D, n_pad).");
  // K scales per lane (VCConfig.k_lane_scales): four per 128-key tile, read by the wide layout's lane kernels
  const bool k_lanes = k_scale.dim() == 4;
  const int64_t tiles = q_q.size(0) * q_q.size(1) * (q_q.size(2) / vc::kKBlock);
  vc::check_k_scale(k_scale, tiles, k_lanes, "");
  TORCH_CHECK_VALUE(!k_lanes || (vc::attn_mma_cta_rows() == 128 && head_dim == 128 && !qk_fp8 && vsmooth),
                    "K scales per lane run in the wide layout's INT8 V-Smooth kernels at head dim 128 only.");
  vc::AttnParams p{};
  p.q_q = q_q.data_ptr();
  p.q_scale = q_scale.data_ptr<float>();
  p.k_q = k_q.data_ptr();
  p.k_scale = k_scale.data_ptr<float>();
  p.v_t = static_cast<const uint8_t*>(v_t.data_ptr());
  p.v_scale = v_scale.data_ptr<float>();
  p.v_mean = static_cast<const uint16_t*>(v_mean.data_ptr());
  if (v_seg_end.has_value()) {
    // the segments' means fill every slot of their segment (VCConfig.v_mean_merge), which only V-Smooth has
    TORCH_CHECK_VALUE(vsmooth, "v_seg_end needs V-Smooth operands (vsmooth=True).");
    check_cuda_contiguous(*v_seg_end, "v_seg_end");
    TORCH_CHECK_VALUE(v_seg_end->scalar_type() == torch::kByte, vc::text("v_seg_end must be uint8, got ", v_seg_end->scalar_type(), "."));
    TORCH_CHECK_VALUE(v_seg_end->numel() == q_q.size(0) * q_q.size(1) * (q_q.size(2) / vc::kKBlock),
                      "v_seg_end must be (B, H, n_pad / 128).");
    p.v_seg_end = static_cast<const uint8_t*>(v_seg_end->data_ptr());
  }
  p.out = out.data_ptr();
  fill_strides(p.o_stride, out);
  if (lse.has_value()) {
    check_cuda_contiguous(*lse, "lse");
    p.lse = lse->data_ptr<float>();
  }
  p.batch = q_q.size(0);
  p.heads = q_q.size(1);
  p.n = n;
  p.n_pad = q_q.size(2);
  p.head_dim = head_dim;
  p.out_bf16 = out.scalar_type() == torch::kBFloat16;
  p.qk_fp8 = qk_fp8;
  p.expcast = expcast;
  p.vsmooth = vsmooth;
  raise_on_error(vc::launch_attn_mma(p, reinterpret_cast<void*>(stream), k_lanes), "attention");
}

// V^T codes (B, H, D, n_pad), one byte each -> (B, H, n_pad / 64, D, 64) float16 as a VC_MMA_V_F16 build reads them
torch::Tensor v_f16(const torch::Tensor& codes, int64_t stream) {
  check_cuda_contiguous(codes, "codes");
  TORCH_CHECK_VALUE(codes.element_size() == 1 && codes.dim() == 4, "codes must be one-byte E4M3 codes, 4-D (B, H, D, n_pad).");
  const int64_t head_dim = codes.size(2), n_pad = codes.size(3);
  TORCH_CHECK_VALUE(head_dim == 64 || head_dim == 128, vc::text("head dim must be 64 or 128, got ", head_dim, "."));
  TORCH_CHECK_VALUE(n_pad % vc::kKBlock == 0, vc::text("n_pad must be a multiple of ", vc::kKBlock, ", got ", n_pad, "."));
  const c10::cuda::CUDAGuard guard(codes.device());
  torch::Tensor out = torch::empty({codes.size(0), codes.size(1), n_pad / 64, head_dim, 64}, codes.options().dtype(torch::kHalf));
  raise_on_error(vc::launch_v_codes_to_f16(codes.data_ptr(), out.data_ptr(), codes.numel() / 16, int(head_dim), int(n_pad),
                                           reinterpret_cast<void*>(stream)),
                 "v_f16");
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "VC-Attention portable mma.sync attention over prepared operands.";
  m.def("attention", &attention, "prepared operands -> out (B,H,N,D view), optional lse (B,H,N); v_seg_end (B,H,n_pad/128) "
        "uint8: the V-Smooth segments' last tiles (the mean restored only there)",
        py::arg("q_q"), py::arg("q_scale"), py::arg("k_q"), py::arg("k_scale"), py::arg("v_t"), py::arg("v_scale"),
        py::arg("v_mean"), py::arg("out"), py::arg("lse"), py::arg("n"), py::arg("qk_fp8"), py::arg("expcast"),
        py::arg("vsmooth"), py::arg("stream"), py::arg("v_seg_end") = py::none());
  m.def("cta_rows", &vc::attn_mma_cta_rows, "query rows per CTA of this build's attention kernel (128: the wide layout)");
  m.def("v_f16", &v_f16, "V^T codes (B, H, D, n_pad) -> (B, H, n_pad / 64, D, 64) float16: the V operand of a VC_MMA_V_F16 build "
        "(per 64-key chunk its shared-memory image: keys permuted within each 16, 16-byte units swizzled by row)",
        py::arg("codes"), py::arg("stream"));
  m.def("v_f16_build", &vc::attn_mma_v_f16, "VC_MMA_V_F16: 0 V^T as the E4M3 codes, 1 as float16 in every kernel, 2 in the "
        "head-dim-128 INT8 V-Smooth kernels");
  m.def("v_f16_kernel", &vc::attn_mma_v_f16_kernel, "whether the kernel of this head dim, QK format and V mode takes V^T as "
        "float16", py::arg("head_dim"), py::arg("qk_fp8"), py::arg("vsmooth"));
  m.def("mean_scaled", &vc::attn_mma_mean_scaled, "1 if this build takes v_mean as float32 mean / v_scale (VC_MMA_MEAN_SCALED)");
}
