// Torch binding of the Hopper (sm_90a) VC-Attention kernel: checks, raw pointers, launch.
// The launcher (sm90_launch.cu) is torch-free; the stream comes from Python as an integer.
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <optional>
#include <type_traits>

#include "binding_checks.h"
#include "refusal_text.h"
#include "vc_constants.h"
#include "vc_params.h"

extern "C" int vc_sm90_forward_all(const void* q_q, const float* q_scale, const void* k_q, const float* k_scale,
                                   const void* v_t, const float* v_scale, const void* v_mean, const void* v_low_t,
                                   const void* v_low_basis, const float* v_low_scale, int v_rank, void* out, int batch,
                                   int heads, int n, int n_pad, int head_dim, long long out_stride_b,
                                   long long out_stride_h, long long out_stride_n, int expcast, int vsmooth,
                                   int out_bf16, void* stream, const void* v_seg_end, const void* v_lo_t,
                                   const int* v_lo_sel, int v_lo_rows, int mixed);
extern "C" int vc_sm90_call_v_lo_channels();
extern "C" int vc_sm90_call_chord_eighths();
extern "C" int vc_sm90_low_rank(int head_dim, int expcast, int vsmooth);
extern "C" const char* vc_sm90_last_error();
extern "C" int vc_sm90_consumers(int head_dim, int expcast, int vsmooth);
extern "C" int vc_sm90_step_keys(int head_dim, int expcast, int vsmooth);
extern "C" int vc_sm90_step_mean(int head_dim, int expcast);
extern "C" int vc_sm90_k_lanes(int head_dim, int expcast);

static_assert(std::is_same_v<decltype(&vc_sm90_forward_all), vc::Sm90ForwardFn>,
              "the prepare extension calls vc_sm90_forward_all as vc::Sm90ForwardFn (vc_params.h)");
static_assert(std::is_same_v<decltype(&vc_sm90_last_error), vc::Sm90ErrorFn>, "vc_sm90_last_error as vc::Sm90ErrorFn");
// Every message is one literal or one vc::text(...) (refusal_text.h: a number written through a stream ended the
// process on the H200). The numbers the literal sentences name:
static_assert(vc::kMaxVRank == 6 && vc::kVLowRows == 8, "the refusals' sentences name these (and vc::kVsmoothPairedK)");

namespace {

void check_operand(const torch::Tensor& t, const char* name, torch::ScalarType dtype) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.is_contiguous(), vc::text(name, " must be a contiguous CUDA tensor."));
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, vc::text(name, " has dtype ", t.scalar_type(), ", expected ", dtype, "."));
}

// out: the (B, H, N, D) view of the caller's output (either layout), channel stride 1.
void attention(const torch::Tensor& q_q, const torch::Tensor& q_scale, const torch::Tensor& k_q,
               const torch::Tensor& k_scale, const torch::Tensor& v_t, const torch::Tensor& v_scale,
               const torch::Tensor& v_mean, const std::optional<torch::Tensor>& v_low_t,
               const std::optional<torch::Tensor>& v_low_basis, const std::optional<torch::Tensor>& v_low_scale,
               torch::Tensor out, int64_t n_tokens, bool expcast, int64_t vsmooth, int64_t stream,
               const std::optional<torch::Tensor>& v_seg_end, const std::optional<torch::Tensor>& v_lo_t,
               const std::optional<torch::Tensor>& v_lo_sel, bool mixed) {
  // vsmooth: 0 per-channel V, 1 V-Smooth, 2 V-Smooth with means equal in 128-row pairs (v_mean_rows = 256); 1 and 2
  // may add vc::kVsmoothPairedK: the K scales are equal in 128-key pairs (k_scale_rows = 256)
  // and on top of 4, vc::kVsmoothKLanes (8): the K scales are per quad lane, k_scale (B, H, n_pad / 128, 4)
  const int64_t v_mode = vsmooth & ~int64_t(vc::kVsmoothPairedK | vc::kVsmoothKLanes);
  TORCH_CHECK_VALUE(vc::valid_vsmooth(vsmooth),
                    vc::text("vsmooth must be 0 (per-channel V), 1 (V-Smooth) or 2 (V-Smooth, means equal in 128-row "
                             "pairs), 1 and 2 optionally plus 4 (K scales equal in 128-key pairs), that plus 8 (K scales "
                             "per lane), got ", vsmooth, "."));
  check_operand(q_q, "q_q", torch::kChar);
  check_operand(k_q, "k_q", torch::kChar);
  check_operand(v_t, "v_t", torch::kFloat8_e4m3fn);
  check_operand(q_scale, "q_scale", torch::kFloat);
  check_operand(k_scale, "k_scale", torch::kFloat);
  check_operand(v_scale, "v_scale", torch::kFloat);
  check_operand(v_mean, "v_mean", torch::kHalf);
  TORCH_CHECK_VALUE(out.is_cuda() && out.dim() == 4 && out.stride(3) == 1, "out must be a 4-D CUDA view with unit channel stride.");
  const c10::cuda::CUDAGuard guard(out.device());  // the launch goes to out's GPU whatever the current one
  TORCH_CHECK_VALUE(out.scalar_type() == torch::kHalf || out.scalar_type() == torch::kBFloat16, "out must be float16 or bfloat16.");
  // the rank first, so a wrong operand gets this sentence rather than torch's index error on size(3)
  TORCH_CHECK_VALUE(q_q.dim() == 4, "q_q must be 4-D (B, H, n_pad, D).");
  const int64_t batch = q_q.size(0), heads = q_q.size(1), n_pad = q_q.size(2), head_dim = q_q.size(3);
  TORCH_CHECK_VALUE(out.size(0) == batch && out.size(1) == heads && out.size(2) == n_tokens && out.size(3) == head_dim,
                    "out must have shape (B, H, N, D) of the operands.");
  TORCH_CHECK_VALUE(batch * heads * n_pad < (int64_t(1) << 31), "B*H*N is too large for the TMA coordinates.");
  TORCH_CHECK_VALUE(q_scale.numel() == batch * heads * n_pad, "q_scale must hold one scale per query row, shape (B, H, n_pad).");
  // the kernel reads k_scale by tile (and lane): its size must be what vsmooth says
  const bool lanes = (vsmooth & vc::kVsmoothKLanes) != 0;
  const int64_t tiles = batch * heads * (n_pad / vc::kKBlock);
  vc::check_k_scale(k_scale, tiles, lanes, " (vsmooth bit 8)");
  // V-Smooth's low-rank term: the three operands together (kernels/operands.py)
  const bool low_rank = v_low_t.has_value();
  TORCH_CHECK_VALUE(low_rank == v_low_basis.has_value() && low_rank == v_low_scale.has_value(),
                    "the low-rank term needs v_low_t, v_low_basis and v_low_scale together.");
  int rank = 0;
  if (low_rank) {
    check_operand(*v_low_t, "v_low_t", torch::kFloat8_e4m3fn);
    check_operand(*v_low_basis, "v_low_basis", torch::kHalf);
    check_operand(*v_low_scale, "v_low_scale", torch::kFloat);
    rank = static_cast<int>(v_low_basis->dim() == 4 ? v_low_basis->size(2) : 0);
    TORCH_CHECK_VALUE(v_low_basis->dim() == 4 && v_low_basis->size(0) == batch && v_low_basis->size(1) == heads &&
                          v_low_basis->size(3) == head_dim && rank >= 1 && rank <= vc::kMaxVRank,
                      vc::text("v_low_basis must be (B, H, rank, D) with rank 1..6, got rank ", rank, "."));
    TORCH_CHECK_VALUE(v_low_t->numel() == batch * heads * vc::kVLowRows * n_pad, "v_low_t must be (B, H, 8, n_pad).");
    TORCH_CHECK_VALUE(v_low_scale->numel() == batch * heads * rank, "v_low_scale must be (B, H, rank).");
  }
  // V-Smooth segment ends (VCConfig.v_mean_merge): one byte per 128-key tile, read with vsmooth 2 only
  if (v_seg_end.has_value()) {
    TORCH_CHECK_VALUE(v_mode == 2, "v_seg_end needs vsmooth=2 (V-Smooth means equal over each segment's tiles).");
    check_operand(*v_seg_end, "v_seg_end", torch::kByte);
    TORCH_CHECK_VALUE(v_seg_end->numel() == batch * heads * (n_pad / vc::kKBlock), "v_seg_end must be (B, H, n_pad / 128).");
  }
  // the V residual's second term (VCConfig.v_lo_channels): v_lo_t (B, H, L, n_pad) e4m3 and v_lo_sel (B, H, L) int32
  TORCH_CHECK_VALUE(v_lo_t.has_value() == v_lo_sel.has_value(), "the V residual's second term needs v_lo_t and v_lo_sel together.");
  int lo_rows = 0;
  if (v_lo_t.has_value()) {
    check_operand(*v_lo_t, "v_lo_t", torch::kFloat8_e4m3fn);
    check_operand(*v_lo_sel, "v_lo_sel", torch::kInt);
    TORCH_CHECK_VALUE(v_lo_t->dim() == 4 && v_lo_t->size(0) == batch && v_lo_t->size(1) == heads &&
                          v_lo_t->size(3) == n_pad && v_lo_t->size(2) >= 1,
                      "v_lo_t must be (B, H, L, n_pad) of the operands.");
    lo_rows = static_cast<int>(v_lo_t->size(2));
    TORCH_CHECK_VALUE(v_lo_sel->numel() == batch * heads * lo_rows, "v_lo_sel must be (B, H, L), L of v_lo_t.");
  }
  const int rc = vc_sm90_forward_all(
      q_q.data_ptr(), q_scale.data_ptr<float>(), k_q.data_ptr(), k_scale.data_ptr<float>(), v_t.data_ptr(),
      v_scale.data_ptr<float>(), v_mean.data_ptr(), low_rank ? v_low_t->data_ptr() : nullptr,
      low_rank ? v_low_basis->data_ptr() : nullptr, low_rank ? v_low_scale->data_ptr<float>() : nullptr, rank,
      out.data_ptr(), static_cast<int>(batch), static_cast<int>(heads), static_cast<int>(n_tokens),
      static_cast<int>(n_pad), static_cast<int>(head_dim), out.stride(0), out.stride(1), out.stride(2), expcast, static_cast<int>(vsmooth),
      out.scalar_type() == torch::kBFloat16, reinterpret_cast<void*>(stream),
      v_seg_end.has_value() ? v_seg_end->data_ptr() : nullptr, v_lo_t.has_value() ? v_lo_t->data_ptr() : nullptr,
      v_lo_sel.has_value() ? v_lo_sel->data_ptr<int32_t>() : nullptr, lo_rows, mixed);
  TORCH_CHECK(rc == 0, vc::text("sm90 attention launch failed: ", vc_sm90_last_error()));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attention", &attention, "VC-Attention forward on prepared operands (Hopper wgmma kernel)", py::arg("q_q"),
        py::arg("q_scale"), py::arg("k_q"), py::arg("k_scale"), py::arg("v_t"), py::arg("v_scale"), py::arg("v_mean"),
        py::arg("v_low_t"), py::arg("v_low_basis"), py::arg("v_low_scale"), py::arg("out"), py::arg("n_tokens"),
        py::arg("expcast"), py::arg("vsmooth"), py::arg("stream"), py::arg("v_seg_end") = py::none(),
        py::arg("v_lo_t") = py::none(), py::arg("v_lo_sel") = py::none(), py::arg("mixed") = false);
  // the entry and its error text as addresses, for the prepare extension's prepare_attend (one binding call per
  // attention call: kernels/backend_sm90.py); valid while this module is loaded, which the caller keeps
  m.def("forward_address", []() { return reinterpret_cast<int64_t>(&vc_sm90_forward_all); },
        "address of vc_sm90_forward_all (vc::Sm90ForwardFn)");
  m.def("refinements", []() { return py::make_tuple(vc_sm90_call_v_lo_channels(), vc_sm90_call_chord_eighths()); },
        "(L, C): the V residual's second term on L channels and the mixed encoding's chord on C eighths of every step, "
        "which this library's fidelity kernel takes per call (v_lo_t / v_lo_sel, mixed=True); 0: none");
  m.def("last_error_address", []() { return reinterpret_cast<int64_t>(&vc_sm90_last_error); },
        "address of vc_sm90_last_error (vc::Sm90ErrorFn)");
  m.def("consumers", [](int64_t head_dim, bool expcast, bool vsmooth) {
    return vc_sm90_consumers(static_cast<int>(head_dim), expcast, vsmooth);
  }, "consumer warpgroups per CTA (64 query rows each) of the kernel that runs this case");
  m.def("low_rank", [](int64_t head_dim, bool expcast, bool vsmooth) {
    return vc_sm90_low_rank(static_cast<int>(head_dim), expcast, vsmooth);
  }, "1 if this build runs the case with the low-rank V term");
  m.def("step_keys", [](int64_t head_dim, bool expcast, bool vsmooth) {
    return vc_sm90_step_keys(static_cast<int>(head_dim), expcast, vsmooth);
  }, "keys per online-softmax step of the kernel that runs this case (its emulation's offset_block)");
  m.def("k_lanes", [](int64_t head_dim, bool expcast) {
    return vc_sm90_k_lanes(static_cast<int>(head_dim), expcast);
  }, "1 if this build runs the case with K scales per lane (vsmooth plus 4 + 8; ExpCast with 2)");
  m.def("step_mean", [](int64_t head_dim, bool expcast) {
    return vc_sm90_step_mean(static_cast<int>(head_dim), expcast);
  }, "1 if this build restores one V-Smooth mean per 256-key step when the means are equal in pairs (vsmooth=2)");
}
