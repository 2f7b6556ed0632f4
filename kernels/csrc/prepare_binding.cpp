// Torch binding of the fused prepare kernels (prepare.cu): tensor checks, raw pointers, launch.
// Its own extension (vc_attention_prepare), shared by every CUDA attention backend.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/extension.h>

#include <optional>
#include <tuple>

#include "binding_checks.h"
#include "refusal_text.h"
#include "vc_constants.h"
#include "vc_params.h"

namespace {

using vc::check_cuda_contiguous;
using vc::fill_strides;
using vc::raise_on_error;

void check_input(const torch::Tensor& t, const char* name, const torch::Tensor& q) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.dim() == 4, vc::text(name, " must be a 4-D CUDA tensor (B, H, N, D view)."));
  TORCH_CHECK_VALUE(t.device() == q.device(), vc::text(name, " must be on q's device (", q.device(), ")."));
  TORCH_CHECK_VALUE(t.scalar_type() == q.scalar_type(), vc::text(name, " must have q's dtype."));
  TORCH_CHECK_VALUE(t.sizes() == q.sizes(), vc::text(name, " must have q's shape."));
  TORCH_CHECK_VALUE(t.stride(3) == 1, vc::text(name, " must have a contiguous last dimension."));
  TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(2) % 8 == 0 && t.stride(1) % 8 == 0 &&
                        t.stride(0) % 8 == 0,
                    vc::text(name, " rows must be 16-byte aligned."));
}

using Operands = std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor,
                            torch::Tensor, std::optional<torch::Tensor>, std::optional<torch::Tensor>,
                            std::optional<torch::Tensor>, std::optional<torch::Tensor>, std::optional<torch::Tensor>>;

// The operand contract (kernels/operands.py) allocated here and filled on q's device and current stream:
// one binding call per attention call. v_basis (B, H, rank, D) float16 turns the low-rank term on (then
// v_low_t and v_low_scale are returned); v_merge the V-Smooth segments (VCConfig.v_mean_merge: then v_seg_end
// is returned); v_lo_channels > 0 the V residual's second term on that many channels (VCConfig.v_lo_channels: then
// v_lo_t and v_lo_sel are returned, last).
//
// Order (a short call's GPU idles until the first launch, so what precedes it is its cost: LTX-Video's
// 0.6 ms call paid ~80 us of host time there, docs/kernel-notes.md sections 25 and 28): the checks, the
// two allocations the statistics pass writes (v_mean and one float32 scratch holding every workspace),
// the scratch's zeroing, the statistics launch; only then the quantized operands' allocations and the
// quantize launch, which the host does while the GPU runs the statistics.
Operands prepare(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const std::optional<torch::Tensor>& perm,
                 const std::optional<torch::Tensor>& v_basis, double qk_scale, bool qk_fp8, bool vsmooth, bool smooth_k,
                 int64_t v_mean_rows, bool v_merge, int64_t k_scale_rows, bool k_lanes, int64_t v_lo_channels) {
  TORCH_CHECK_VALUE(q.is_cuda() && q.dim() == 4, "q must be a 4-D CUDA tensor (B, H, N, D view).");
  TORCH_CHECK_VALUE(q.scalar_type() == torch::kHalf || q.scalar_type() == torch::kBFloat16, "q must be float16 or bfloat16.");
  check_input(q, "q", q);
  check_input(k, "k", q);
  check_input(v, "v", q);
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  const int64_t b = q.size(0), h = q.size(1), n = q.size(2), d = q.size(3);
  TORCH_CHECK_VALUE(d == 64 || d == 128, vc::text("head dim must be 64 or 128, got ", d, "."));
  const int64_t n_pad = (n + vc::kKBlock - 1) / vc::kKBlock * vc::kKBlock;
  const int64_t bh = b * h, slots = n_pad / vc::kKBlock, nb = (n_pad + 2 * vc::kKBlock - 1) / (2 * vc::kKBlock);
  TORCH_CHECK_VALUE(v_mean_rows == vc::kKBlock || v_mean_rows == 2 * vc::kKBlock, vc::text("v_mean_rows must be ", vc::kKBlock,
                    " or ", 2 * vc::kKBlock, ", got ", v_mean_rows, "."));
  // K scales per 256 keys: the statistics pass takes each of its blocks' K extremes (256 or 128 rows, as the V means)
  TORCH_CHECK_VALUE(k_scale_rows == vc::kKBlock || k_scale_rows == 2 * vc::kKBlock, vc::text("k_scale_rows must be ", vc::kKBlock,
                    " or ", 2 * vc::kKBlock, ", got ", k_scale_rows, "."));
  const bool k_pair = k_scale_rows == 2 * vc::kKBlock;
  TORCH_CHECK_VALUE(!k_pair || !(vc::prepare_rows_in_regs() || vc::prepare_legacy_quantize() || vc::prepare_staged_stats() ||
                                 vc::prepare_stats_prefetch()),
                    vc::text("this prepare build variant takes K scales per ", vc::kKBlock, " keys only (k_scale_rows ", k_scale_rows, ")."));
  // V-Smooth's low-rank term
  const bool low_rank = v_basis.has_value();
  int64_t rank = 0;
  if (low_rank) {
    TORCH_CHECK_VALUE(vsmooth, "the low-rank V term needs V-Smooth.");
    check_cuda_contiguous(*v_basis, "low-rank operand");
    rank = v_basis->dim() == 4 ? v_basis->size(2) : 0;
    TORCH_CHECK_VALUE(v_basis->scalar_type() == torch::kHalf && v_basis->dim() == 4 && v_basis->size(0) == b &&
                          v_basis->size(1) == h && v_basis->size(3) == d && rank >= 1 && rank <= vc::kMaxVRank,
                      vc::text("v_basis must be float16 (B, H, rank, D) with rank 1..", vc::kMaxVRank, "."));
    TORCH_CHECK_VALUE(!k_pair, vc::text("K scales per ", 2 * vc::kKBlock, " keys take no low-rank V term."));
  }
  // K scales per lane (prepare_k_lanes.cuh): the presets' paired-K V-Smooth configuration only
  TORCH_CHECK_VALUE(!k_lanes || (k_pair && vsmooth && !qk_fp8 && !low_rank),
                    vc::text("K scales per lane need INT8 Q and K, V-Smooth, k_scale_rows ", 2 * vc::kKBlock,
                             " and no low-rank V term."));
  TORCH_CHECK_VALUE(!k_lanes || !(vc::prepare_rows_in_regs() || vc::prepare_legacy_quantize() || vc::prepare_staged_stats()),
                    "this prepare build variant has no K scales per lane.");
  if (v_merge)
    TORCH_CHECK_VALUE(vsmooth && v_mean_rows == 2 * vc::kKBlock, vc::text("V-Smooth segments need V-Smooth with ", 2 * vc::kKBlock,
                      "-row means."));
  // the V residual's second term (prepare_v_lo.cuh): the default build's passes, V-Smooth without the low-rank term
  TORCH_CHECK_VALUE(v_lo_channels >= 0 && v_lo_channels <= vc::kMaxVLoChannels,
                    vc::text("v_lo_channels must be 0 to ", vc::kMaxVLoChannels, ", got ", v_lo_channels, "."));
  TORCH_CHECK_VALUE(!v_lo_channels || (vsmooth && !low_rank),
                    "the V residual's second term (v_lo_channels) needs V-Smooth and no low-rank V term.");
  TORCH_CHECK_VALUE(!v_lo_channels || !(vc::prepare_rows_in_regs() || vc::prepare_legacy_quantize() ||
                                        vc::prepare_staged_stats() || vc::prepare_stats_prefetch()),
                    "this prepare build variant has no V residual second term (v_lo_channels): use the default build.");
  const auto on_q = q.options();
  const auto f32 = on_q.dtype(torch::kFloat32);

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
    TORCH_CHECK_VALUE(perm->numel() == bh * n, "perm must be (B, H, N).");
    p.perm = perm->data_ptr<int32_t>();
  }
  p.batch = static_cast<int>(b);
  p.heads = static_cast<int>(h);
  p.n = static_cast<int>(n);
  p.n_pad = static_cast<int>(n_pad);
  p.head_dim = static_cast<int>(d);
  p.qk_scale = static_cast<float>(qk_scale);
  p.input_bf16 = q.scalar_type() == torch::kBFloat16;
  p.qk_fp8 = qk_fp8;
  p.vsmooth = vsmooth;
  p.smooth_k = smooth_k;
  p.v_rank = static_cast<int>(rank);
  p.v_merge = v_merge;
  p.k_pair = k_pair;
  p.k_lanes = k_lanes;
  p.v_lo_channels = static_cast<int>(v_lo_channels);

  // What the statistics pass writes. v_mean: per-channel V's mean restore reads zeros (operands.py).
  auto v_mean = vsmooth ? torch::empty({b, h, slots, d}, on_q.dtype(torch::kHalf))
                        : torch::zeros({b, h, slots, d}, on_q.dtype(torch::kHalf));
  // One float32 scratch, in this order: the zeroed head (k_sum and v_amax (B,H,D) each, one done-counter per
  // head, the low-rank coefficients' amax (B,H,kMaxVRank)), then what every block writes for itself: the
  // per-block K sums (B,H,n_pad/128,D), the segments' block statistics ((B,H,nb,D) mean and amax, (B,H,nb)
  // energy and first block), the K extremes per 256-key block ((B,H,nb,D) max and min), K's lane order (bytes), the
// statistics blocks' residual energy per channel for the V residual's second term ((B,H,statistics blocks,D))
  // (each region starts on a 128-byte line: separate allocations were 512-byte aligned, and the atomics'
  // head shares no line with the blocks' own writes)
  const auto line = [](int64_t floats) { return (floats + 31) / 32 * 32; };
  const int64_t zeroed = 2 * bh * d + bh + (low_rank ? bh * vc::kMaxVRank : 0);
  const int64_t partial = line(smooth_k ? bh * slots * d : 0);
  const int64_t seg = line(v_merge ? bh * nb * (2 * d + 2) : 0);
  // K extremes per statistics block: 256 rows, or 128 with 128-row means (k_pair_amax combines a pair's two)
  const int64_t k_blocks = (n_pad + v_mean_rows - 1) / v_mean_rows;
  const int64_t kext = k_pair && !k_lanes ? 2 * bh * k_blocks * d : 0;
  // K scales per lane: each position's source row within its 128-key block, one byte (bh * n_pad bytes)
  const int64_t order = k_lanes ? line((bh * n_pad + 3) / 4) : 0;
  const int64_t lo_energy = v_lo_channels ? line(bh * k_blocks * d) : 0;  // one statistics block per V-Smooth mean
  auto scratch = torch::empty({line(zeroed) + partial + seg + kext + order + lo_energy}, f32);
  float* base = scratch.data_ptr<float>();
  const cudaError_t zero_rc = cudaMemsetAsync(base, 0, zeroed * sizeof(float), stream);
  TORCH_CHECK(zero_rc == cudaSuccess, vc::text("prepare: zeroing the statistics workspace failed: ", cudaGetErrorString(zero_rc)));
  p.v_mean = static_cast<uint16_t*>(v_mean.data_ptr());
  p.k_sum = base;
  p.v_amax = p.k_sum + bh * d;
  p.k_done = reinterpret_cast<unsigned int*>(p.v_amax + bh * d);
  if (low_rank) {
    p.c_amax = reinterpret_cast<float*>(p.k_done + bh);
    p.v_basis = static_cast<const uint16_t*>(v_basis->data_ptr());
  }
  float* cursor = base + line(zeroed);
  p.k_partial = cursor;
  cursor += partial;
  if (v_merge) {
    p.blk_mean = cursor;
    p.blk_amax = p.blk_mean + bh * nb * d;
    p.blk_energy = p.blk_amax + bh * nb * d;
    p.blk_seg_first = reinterpret_cast<int*>(p.blk_energy + bh * nb);
    cursor += seg;
  }
  if (kext) {
    p.k_blk_max = cursor;
    p.k_blk_min = p.k_blk_max + bh * k_blocks * d;
    cursor += kext;
  }
  if (k_lanes) p.k_order = reinterpret_cast<uint8_t*>(cursor);  // written by the K lanes kernel (quantize half)
  cursor += order;
  if (v_lo_channels) p.lo_energy = cursor;
  raise_on_error(vc::launch_prepare_stats(p, stream), "prepare (statistics)");

  // The quantized operands, allocated while the statistics pass runs
  auto q_q = torch::empty({b, h, n_pad, d}, on_q.dtype(qk_fp8 ? torch::kFloat8_e4m3fn : torch::kChar));
  auto k_q = torch::empty({b, h, n_pad, d}, q_q.options());
  auto q_scale = torch::empty({b, h, n_pad}, f32);
  auto k_scale = k_lanes ? torch::empty({b, h, slots, vc::kKLanes}, f32) : torch::empty({b, h, slots}, f32);
  auto v_t = torch::empty({b, h, d, n_pad}, on_q.dtype(torch::kFloat8_e4m3fn));
  auto v_scale = torch::empty({b, h, d}, f32);
  std::optional<torch::Tensor> v_low_t, v_low_scale, v_seg_end, v_lo_t, v_lo_sel;
  if (low_rank) {
    v_low_t = torch::empty({b, h, vc::kVLowRows, n_pad}, on_q.dtype(torch::kFloat8_e4m3fn));
    v_low_scale = torch::empty({b, h, rank}, f32);
    p.v_low_t = static_cast<uint8_t*>(v_low_t->data_ptr());
    p.v_low_scale = v_low_scale->data_ptr<float>();
  }
  if (v_merge) {
    v_seg_end = torch::empty({b, h, slots}, on_q.dtype(torch::kByte));
    p.v_seg_end = static_cast<uint8_t*>(v_seg_end->data_ptr());
  }
  if (v_lo_channels) {
    v_lo_t = torch::empty({b, h, v_lo_channels, n_pad}, on_q.dtype(torch::kFloat8_e4m3fn));
    v_lo_sel = torch::empty({b, h, v_lo_channels}, on_q.dtype(torch::kInt32));
    p.v_lo_t = static_cast<uint8_t*>(v_lo_t->data_ptr());
    p.v_lo_sel = v_lo_sel->data_ptr<int32_t>();
  }
  p.q_q = q_q.data_ptr();
  p.q_scale = q_scale.data_ptr<float>();
  p.k_q = k_q.data_ptr();
  p.k_scale = k_scale.data_ptr<float>();
  p.v_t = static_cast<uint8_t*>(v_t.data_ptr());
  p.v_scale = v_scale.data_ptr<float>();
  raise_on_error(vc::launch_prepare_quantize(p, stream), "prepare (quantize)");
  // the scratch is freed here, its blocks reused only by work queued after the quantize pass (the caching
  // allocator's stream order)
  return {q_q, q_scale, k_q, k_scale, v_t, v_scale, v_mean, v_low_t, v_low_scale, v_seg_end, v_lo_t, v_lo_sel};
}

// prepare, then the Hopper kernel through the sm90 extension's C entry (forward_fn, error_fn: the addresses of
// its forward_address() / last_error_address()), in one binding call: the ten operand tensors never reach
// Python and the attention binding's checks and argument parsing go (a short call's host time: its GPU waits
// for the attention launch, docs/kernel-notes.md section 28). out: the (B, H, N, D) view of the caller's output,
// channel stride 1, q's dtype; vsmooth_mode as the sm90 attention binding's vsmooth (0, 1, 2, the last two plus
// vc::kVsmoothPairedK where k_scale_rows is 256, plus vc::kVsmoothKLanes with K scales per lane; the segment ends go to mode 2 only, kernels/backend_sm90.vsmooth_mode). The operands are freed on return, after the launch that
// reads them was queued on this stream (the caching allocator hands their blocks out in stream order).
void prepare_attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    const std::optional<torch::Tensor>& perm, const std::optional<torch::Tensor>& v_basis,
                    double qk_scale, bool qk_fp8, bool vsmooth, bool smooth_k, int64_t v_mean_rows, bool v_merge,
                    int64_t k_scale_rows, bool k_lanes, int64_t v_lo_channels, const torch::Tensor& out, bool expcast,
                    int64_t vsmooth_mode, int64_t forward_fn, int64_t error_fn, bool mixed) {
  TORCH_CHECK_VALUE(forward_fn != 0 && error_fn != 0, "prepare_attend needs the sm90 extension's entry addresses.");
  // the V residual's second term (v_lo_channels) and the mixed encoding go on to the Hopper entry, which refuses a call
  // whose kernel lacks them (its channel count included)
  TORCH_CHECK_VALUE(!(mixed && expcast), "the mixed encoding is an exp2-family encoding: expcast must be false.");
  TORCH_CHECK_VALUE(!qk_fp8, "the Hopper kernel takes INT8 Q and K only.");
  // vc::kVsmoothPairedK on top of 1 or 2 says the K scales are equal in 128-key pairs: only where this prepare pairs them
  const int64_t v_mode = vsmooth_mode & ~int64_t(vc::kVsmoothPairedK | vc::kVsmoothKLanes);
  TORCH_CHECK_VALUE(vc::valid_vsmooth(vsmooth_mode) && (v_mode == 0) == !vsmooth,
                    vc::text("vsmooth_mode must be 0 without V-Smooth, 1 or 2 with it (optionally plus 4: paired K "
                             "scales), got ", vsmooth_mode, vsmooth ? " with V-Smooth." : " without V-Smooth."));
  TORCH_CHECK_VALUE(!(vsmooth_mode & vc::kVsmoothPairedK) || k_scale_rows == 2 * vc::kKBlock,
                    "vsmooth_mode says the K scales are paired, but this prepare keeps one K scale per 128 keys.");
  // with ExpCast, mode 2 runs the speed loop that also reads one K scale per 256-key step (VC_SM90_KPAIR)
  TORCH_CHECK_VALUE(!(expcast && v_mode == 2) || k_scale_rows == 2 * vc::kKBlock,
                    "vsmooth_mode 2 with ExpCast runs the loop that reads one K scale per 256-key step, but this prepare "
                    "keeps one K scale per 128 keys.");
  // vc::kVsmoothKLanes says the K scales are per lane (with the paired-K bit): exactly where this prepare writes them
  const bool lane_bit = (vsmooth_mode & vc::kVsmoothKLanes) != 0;
  TORCH_CHECK_VALUE(lane_bit || !k_lanes, "this prepare writes K scales per lane, but vsmooth_mode does not say so (bit 8).");
  TORCH_CHECK_VALUE(!lane_bit || k_lanes,
                    "vsmooth_mode says the K scales are per lane (bit 8), but this prepare keeps one per block.");
  TORCH_CHECK_VALUE(out.is_cuda() && out.dim() == 4 && out.stride(3) == 1 && out.sizes() == q.sizes() &&
                        out.scalar_type() == q.scalar_type() && out.device() == q.device(),
                    "out must be a (B, H, N, D) view with q's shape, dtype and device and unit channel stride.");
  const auto [q_q, q_scale, k_q, k_scale, v_t, v_scale, v_mean, v_low_t, v_low_scale, v_seg_end, v_lo_t, v_lo_sel] =
      prepare(q, k, v, perm, v_basis, qk_scale, qk_fp8, vsmooth, smooth_k, v_mean_rows, v_merge, k_scale_rows, k_lanes,
              v_lo_channels);
  const int64_t b = q_q.size(0), h = q_q.size(1), n_pad = q_q.size(2), d = q_q.size(3);
  TORCH_CHECK_VALUE(b * h * n_pad < (int64_t(1) << 31), "B*H*N is too large for the TMA coordinates.");
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  const bool low_rank = v_low_t.has_value();
  const auto forward = reinterpret_cast<vc::Sm90ForwardFn>(forward_fn);
  const int rc = forward(
      q_q.data_ptr(), q_scale.data_ptr<float>(), k_q.data_ptr(), k_scale.data_ptr<float>(), v_t.data_ptr(),
      v_scale.data_ptr<float>(), v_mean.data_ptr(), low_rank ? v_low_t->data_ptr() : nullptr,
      low_rank ? v_basis->data_ptr() : nullptr, low_rank ? v_low_scale->data_ptr<float>() : nullptr,
      low_rank ? static_cast<int>(v_basis->size(2)) : 0, out.data_ptr(), static_cast<int>(b), static_cast<int>(h),
      static_cast<int>(q.size(2)), static_cast<int>(n_pad), static_cast<int>(d), out.stride(0), out.stride(1),
      out.stride(2), expcast, static_cast<int>(vsmooth_mode), out.scalar_type() == torch::kBFloat16, stream,
      v_mode == 2 && v_seg_end.has_value() ? v_seg_end->data_ptr() : nullptr,
      v_lo_t.has_value() ? v_lo_t->data_ptr() : nullptr, v_lo_sel.has_value() ? v_lo_sel->data_ptr<int32_t>() : nullptr,
      static_cast<int>(v_lo_channels), mixed);
  TORCH_CHECK(rc == 0, vc::text("sm90 attention launch failed: ", reinterpret_cast<vc::Sm90ErrorFn>(error_fn)()));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "VC-Attention fused prepare: q, k, v (+perm) -> the quantized operands of the attention kernels.";
  m.def("prepare", &prepare, "q, k, v (+perm, +v_basis) -> the quantized operands (q_q, q_scale, k_q, k_scale, v_t, v_scale, "
        "v_mean, v_low_t, v_low_scale, v_seg_end, v_lo_t, v_lo_sel), on q's device and current stream; k_scale_rows 256 "
        "stores each 256-key block's K scale in both of its 128-key slots");
  m.def("prepare_attend", &prepare_attend, "prepare, then the Hopper kernel through the sm90 extension's C entry "
        "(forward_fn, error_fn: its forward_address(), last_error_address()) into out, in one call");
  m.def("rows_in_regs", &vc::prepare_rows_in_regs, "1 if this build runs the register-staged kernels (VC_PREP_ROWS_IN_REGS)");
  m.def("legacy_quantize", &vc::prepare_legacy_quantize,
        "1 if this build runs prepare.cuh's quantize kernel instead of the staged one (VC_PREP_LEGACY_QUANTIZE)");
  m.def("staged_stats", &vc::prepare_staged_stats,
        "1 if this build runs prepare_staged.cuh's statistics kernel instead of prepare.cuh's (VC_PREP_STAGED_STATS)");
  m.def("stats_prefetch", &vc::prepare_stats_prefetch,
        "1 if this build's statistics kernel loads its permutation indices first (VC_PREP_STATS_PREFETCH)");
}
