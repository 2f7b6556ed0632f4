// Host side of the Hopper kernel: TMA tensor maps for the prepared operands and the launch.
// Torch-free C entry point (raw device pointers + stream), so the same object serves the torch
// binding (sm90_binding.cpp) and a plain ctypes load.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "sm90_attention.cuh"

// VC_SM90_SPLIT=1 (the product library, kernels/backend_sm90.py): this file is compiled twice, as itself
// (two consumer warpgroups per CTA) and through sm90_launch_c3.cu (three), each build instantiating only
// the kernels that split_consumers gives it; vc_sm90_forward of the two-consumer build sends each call
// on. Without it (bench/sm90_variants.sh's single-file variants) one build serves every kernel.
#ifndef VC_SM90_SPLIT
#define VC_SM90_SPLIT 0
#endif
#if VC_SM90_SPLIT && VC_SM90_CONSUMERS == 3
#define VC_SM90_EXPORT(name) name##_c3  // the three-consumer build's entry points, called by the other build
#else
#define VC_SM90_EXPORT(name) name
#endif

#ifndef VC_SM90_STAGES_D128
#define VC_SM90_STAGES_D128 4
#endif
#ifndef VC_SM90_STAGES_D64
#define VC_SM90_STAGES_D64 6
#endif

namespace vc_sm90 {
constexpr int kVsmoothPairMeans = 2;  // the forward's vsmooth argument for means equal in 128-row pairs
// vc::kVsmoothPairedK, a bit the forward's vsmooth argument may add to V-Smooth's 1 or 2: the K scales are equal
// in 128-key pairs (VCConfig.k_scale_rows = 256). A statement about the operands: a kernel that reads per-tile
// scales ignores it.
using vc::kVsmoothPairedK;
// vc::kVsmoothKLanes, on top of kVsmoothPairedK: the K scales are per quad lane (k_scale (B,H,n_pad/128,4),
// VCConfig.k_lane_scales); only the paired-K 256-key loops read them (their KLANES instantiations)
using vc::kVsmoothKLanes;

// Which consumer count runs a (head dim, P mode, V mode) in the split build, from the side-by-side run on
// the H200 (docs/kernel-notes.md section 17): three warpgroups won every case (Wan2.2-14B speed 124.6 vs
// 131.5 ms, plain 8-bit 128.9 vs 138.4, head dim 64 exp2 V-Smooth 15.5 vs 19.4) except head dim 128 with
// exact exp2 P and V-Smooth (fidelity: 147.0 vs 144.7 ms), where the serial loop spills.
// That case also steps its online softmax by 256 keys (VC_SM90_STEP256, the product flag): 138.0 vs
// 144.9 ms at Wan2.2-14B, 7.82 vs 8.33 at Wan2.1-1.3B (kernel-notes section 18).
// VC_SM90_SPLIT_SPEED_D128=2 (a product flag since session 9): head dim 128 speed (ExpCast + V-Smooth) on
// two consumers as well, on the 256-key loop with the early QK (VC_SM90_STEP256_EARLY_QK=2): 121.8 vs
// 125.0 ms at Wan2.2-14B, 7.04 vs 7.23 at Wan2.1-1.3B, same run (section 19). Its ptxas report carries
// a C7517 note (a warpgroup.wait injected): the PTX line it names is in the epilogue's output store,
// after the loop, where ptxas cannot prove the last QK group retired on every path; once per CTA.
#ifndef VC_SM90_SPLIT_SPEED_D128
#define VC_SM90_SPLIT_SPEED_D128 3
#endif
constexpr int split_consumers(int head_dim, bool expcast, bool vsmooth) {
  if (head_dim == 128 && vsmooth) return expcast ? VC_SM90_SPLIT_SPEED_D128 : 2;
  return 3;
}

namespace {

char g_error[512] = "";

int fail(const char* what) {
  snprintf(g_error, sizeof(g_error), "%s", what);
  return 1;
}

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  if (fn == nullptr) {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }
  return fn;
}

// A byte tensor map: dims/box innermost first; strides (bytes) of dims 1..rank-1.
bool byte_map(CUtensorMap* map, const void* base, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
              const cuuint32_t* box, CUtensorMapSwizzle swizzle) {
  const cuuint32_t unit[5] = {1, 1, 1, 1, 1};
  PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled();
  return encode != nullptr &&
         encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, const_cast<void*>(base), dims, strides, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// VLO / CHORD: the kernel's (consumer_loop), by default what this build instantiates (build_v_lo, build_chord)
template <int D, bool EXPCAST, bool VSMOOTH, typename OutT, int STAGES, bool LOWRANK, bool STEPMEAN, bool KPAIR = false,
          bool KLANES = false, int VLO = build_v_lo(EXPCAST, VSMOOTH, LOWRANK, KPAIR), int CHORD = build_chord(EXPCAST)>
int launch(const void* q_q, const void* k_q, const void* v_t, const void* v_low_t, const Params& p, int bh,
           cudaStream_t stream) {
  // the kernels with the residual's second term (fidelity's paired-K exp2 kernels): v_low_t is then v_lo_t
  constexpr int kVLo = VLO;
  using L = LayoutFor<D, EXPCAST, VSMOOTH, STAGES, LOWRANK, kVLo>;
  const CUtensorMapSwizzle row_swizzle = D == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  const cuuint64_t rows = static_cast<cuuint64_t>(bh) * p.n_pad;
  CUtensorMap tm_q, tm_k, tm_vt, tm_vlow;
  {
    const cuuint64_t dims[2] = {D, rows}, strides[1] = {D};
    const cuuint32_t box[2] = {D, kBlockM};
    if (!byte_map(&tm_q, q_q, 2, dims, strides, box, row_swizzle)) return fail("tensor map for Q failed");
  }
  {
    // Key 16m + 4t + 2h + e lands in shared row 16m + 8h + 2t + e: dims (channel, e, t, h, m).
    const cuuint64_t dims[5] = {D, 2, 4, 2, rows / 16}, strides[4] = {D, 4 * D, 2 * D, 16 * D};
    const cuuint32_t box[5] = {D, 2, 4, 2, kBlockN / 16};
    if (!byte_map(&tm_k, k_q, 5, dims, strides, box, row_swizzle)) return fail("tensor map for K failed");
  }
  {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(p.n_pad), static_cast<cuuint64_t>(bh) * D};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p.n_pad)};
    const cuuint32_t box[2] = {kBlockN, D};
    if (!byte_map(&tm_vt, v_t, 2, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B))
      return fail("tensor map for V^T failed");
  }
  if constexpr (LOWRANK) {  // the extra V^T rows (v_low_t): one 8-row box per tile, swizzled like V^T
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(p.n_pad), static_cast<cuuint64_t>(bh) * vc::kVLowRows};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p.n_pad)};
    const cuuint32_t box[2] = {kBlockN, vc::kVLowRows};
    if (!byte_map(&tm_vlow, v_low_t, 2, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B))
      return fail("tensor map for the low-rank V rows failed");
  } else if constexpr (kVLo > 0) {  // v_lo_t (B,H,kVLo,n_pad): one kVLo-row box per tile, swizzled like V^T
    if (v_low_t == nullptr || p.v_lo_sel == nullptr)
      return fail("this build's fidelity kernel takes the V residual's second term: call vc_sm90_forward_v_lo");
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(p.n_pad), static_cast<cuuint64_t>(bh) * kVLo};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p.n_pad)};
    const cuuint32_t box[2] = {kBlockN, kVLo};
    if (!byte_map(&tm_vlow, v_low_t, 2, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B))
      return fail("tensor map for the V residual's second term failed");
  } else {
    // the second term was passed (vc_sm90_forward_v_lo) but this call runs a kernel without it: refuse, not drop it
    if (!LOWRANK && p.v_lo_sel != nullptr)
      return fail("the V residual's second term runs in fidelity's paired-K kernel only (head dim 128, V-Smooth, exp2 P, "
                  "K scales per 256 keys)");
    tm_vlow = tm_vt;  // unread
  }
  auto kernel = [] {
    if constexpr (VLO > 0 || CHORD > 0)
      return vc_attention_sm90_kernel_lo_chord<D, EXPCAST, VSMOOTH, OutT, STAGES, LOWRANK, STEPMEAN, KPAIR, KLANES, VLO, CHORD>;
    else
      return vc_attention_sm90_kernel<D, EXPCAST, VSMOOTH, OutT, STAGES, LOWRANK, STEPMEAN, KPAIR, KLANES>;
  }();
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kAlloc) != cudaSuccess)
    return fail("cudaFuncSetAttribute(max dynamic shared memory) failed");
  const dim3 grid((p.n_pad + kBlockM - 1) / kBlockM, bh);  // 192-row CTAs (3 consumers) overhang n_pad
  kernel<<<grid, kThreads, L::kAlloc, stream>>>(tm_q, tm_k, tm_vt, tm_vlow, p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return fail(cudaGetErrorString(err));
  return 0;
}

template <int D>
constexpr int stages_for() {
  return D == 128 ? VC_SM90_STAGES_D128 : VC_SM90_STAGES_D64;
}

// Whether the 256-key loops restore a step's means in the next step's PV batch for this P mode (mean_in_pv).
constexpr bool deferred_means(bool expcast) {
  return VC_SM90_STEP256_MEAN_PV == 1 || (VC_SM90_STEP256_MEAN_PV == 2 && !expcast);
}

// Whether this build runs (head dim, P mode, V mode) with the low-rank V term (low_rank_loop).
constexpr bool has_low_rank(int head_dim, bool expcast, bool vsmooth) {
  const int consumers = VC_SM90_SPLIT ? split_consumers(head_dim, expcast, vsmooth) : kConsumers;
  const int stages = head_dim == 128 ? VC_SM90_STAGES_D128 : VC_SM90_STAGES_D64;
  return consumers == kConsumers && low_rank_loop(head_dim, vsmooth, consumers, stages) && !deferred_means(expcast);
}

// Whether (head dim, P mode, V mode) runs this build's 256-key loops (step256 in this file's consumer count).
constexpr bool on_step256_loop(int head_dim, bool expcast, bool vsmooth) {
  const int consumers = VC_SM90_SPLIT ? split_consumers(head_dim, expcast, vsmooth) : kConsumers;
  const int stages = head_dim == 128 ? VC_SM90_STAGES_D128 : VC_SM90_STAGES_D64;
  return consumers == kConsumers && step256(head_dim, consumers, stages);
}

// Whether this build has the one-mean-per-step kernel for (head dim, P mode, V mode): ExpCast with V-Smooth
// on the early-QK 256-key loop (the speed kernel at head dim 128), without the low-rank term. Elsewhere
// means equal in pairs run the two-mean fold, which is right for them too.
constexpr bool has_step_mean(int head_dim, bool expcast, bool vsmooth) {
  // ExpCast's on the early-QK loop; exp2's (VC_SM90_STEPMEAN_EXP2, a variant) on the loop without it
  const bool loop_has_it = expcast ? early_qk_loop(expcast) : (VC_SM90_STEPMEAN_EXP2 && !early_qk_loop(expcast));
  return vsmooth && on_step256_loop(head_dim, expcast, vsmooth) && loop_has_it && !deferred_means(expcast);
}

// Whether this build has fidelity's exp2 256-key loop with one K scale per step (VC_SM90_KPAIR_EXP2): V-Smooth at
// head dim 128 on the two-mean fold (not the exp2 one-mean loop, not the deferred means), without the low-rank term.
constexpr bool has_k_pair_exp2(int head_dim, bool expcast, bool vsmooth) {
  return VC_SM90_KPAIR_EXP2 && !expcast && vsmooth && head_dim == 128 && on_step256_loop(head_dim, expcast, vsmooth) &&
         !early_qk_loop(expcast) && !deferred_means(expcast);
}

// Whether this build has the lane-scale kernel of (head dim, P mode, V mode): the paired-K 256-key loops, the speed
// loop's one-mean-per-step kernel with VC_SM90_KPAIR and fidelity's exp2 loop with VC_SM90_KPAIR_EXP2.
constexpr bool has_k_lanes(int head_dim, bool expcast, bool vsmooth) {
  return expcast ? VC_SM90_KPAIR && has_step_mean(head_dim, true, vsmooth) : has_k_pair_exp2(head_dim, false, vsmooth);
}

// Whether this library instantiates fidelity's refined kernels, chosen per call (launch_refined): the product build
// (no VC_SM90_V_LO / VC_SM90_EXP2_CHORD_EIGHTHS variant default: a variant build's kernels all carry its own) with
// the paired-K exp2 loop. Their (VLO, CHORD): vc::kSm90VLoChannels rows of the second term when the call passes it,
// vc::kMixedChordEighths of the chord when the call asks for the mixed encoding (kernels/constants.py).
constexpr bool has_refined_kernels(int head_dim, bool expcast, bool vsmooth) {
  // (a build that puts the paired-K exp2 kernel on the early-QK loop, VC_SM90_STEP256_EARLY_QK=3, has none: the
  // second term's loop is the one without it, consumer_loop's static_assert)
  return VC_SM90_V_LO == 0 && VC_SM90_EXP2_CHORD_EIGHTHS == 0 && has_k_pair_exp2(head_dim, expcast, vsmooth) &&
         !early_qk_loop(expcast, true);
}

// The refinements a call asked for (the second V term: p.v_lo_sel != nullptr; mixed: the mixed P encoding) on
// fidelity's paired-K exp2 kernel (no lanes), each of the three refined kernels of the product library.
template <int D, bool EXPCAST, bool VSMOOTH, typename OutT, int STAGES>
int launch_refined(const void* q_q, const void* k_q, const void* v_t, const void* v_low_t, const Params& p, int bh,
                   bool mixed, cudaStream_t stream) {
  constexpr int L = vc::kSm90VLoChannels, C = vc::kMixedChordEighths;
  const bool lo = p.v_lo_sel != nullptr;
  if (lo && L == 0) return fail("this library has no kernel with the V residual's second term");
  if constexpr (L > 0) {
    if (lo && mixed) return launch<D, EXPCAST, VSMOOTH, OutT, STAGES, false, false, true, false, L, C>(q_q, k_q, v_t, v_low_t, p, bh, stream);
    if (lo) return launch<D, EXPCAST, VSMOOTH, OutT, STAGES, false, false, true, false, L, 0>(q_q, k_q, v_t, v_low_t, p, bh, stream);
  }
  return launch<D, EXPCAST, VSMOOTH, OutT, STAGES, false, false, true, false, 0, C>(q_q, k_q, v_t, v_low_t, p, bh, stream);
}

// pair_means: the V-Smooth means are equal in 128-row pairs; pair_k: so are the K scales; lanes: the K scales are per
// quad lane (then only the kernels has_k_lanes names run the call); mixed: the mixed P encoding (refined kernels only)
template <int D, bool EXPCAST, bool VSMOOTH, bool LOWRANK>
int launch_out(const void* q_q, const void* k_q, const void* v_t, const void* v_low_t, const Params& p, int bh,
               bool out_bf16, bool pair_means, bool pair_k, bool lanes, bool mixed, cudaStream_t stream) {
  constexpr int kStages = stages_for<D>();
  // the refinements (the second V term, the mixed encoding) run in fidelity's paired-K kernel without lanes only
  const bool refined = mixed || (p.v_lo_sel != nullptr && VC_SM90_V_LO == 0);
  if (refined) {
    if constexpr (!LOWRANK && has_refined_kernels(D, EXPCAST, VSMOOTH)) {
      if (pair_k && !lanes && !(pair_means && has_step_mean(D, EXPCAST, VSMOOTH)))
        return out_bf16 ? launch_refined<D, EXPCAST, VSMOOTH, __nv_bfloat16, kStages>(q_q, k_q, v_t, v_low_t, p, bh, mixed, stream)
                        : launch_refined<D, EXPCAST, VSMOOTH, __half, kStages>(q_q, k_q, v_t, v_low_t, p, bh, mixed, stream);
    }
    return fail("the V residual's second term and the mixed encoding run in fidelity's paired-K kernel only (head dim "
                "128, V-Smooth, exp2 P, K scales per 256 keys, not per lane) of the product library");
  }
  if constexpr (VC_SM90_SPLIT && split_consumers(D, EXPCAST, VSMOOTH) != kConsumers) {
    return fail("internal: this kernel lives in the other consumer build");  // never instantiated here
  } else if constexpr (LOWRANK && !has_low_rank(D, EXPCAST, VSMOOTH)) {
    return fail("this build has no low-rank V kernel for this head dim and mode");  // never instantiated
  } else {
    if constexpr (!LOWRANK && has_k_lanes(D, EXPCAST, VSMOOTH)) {
      if constexpr (EXPCAST) {  // the speed loop's one-mean-per-step kernel
        if (lanes && pair_means && pair_k)
          return out_bf16 ? launch<D, EXPCAST, VSMOOTH, __nv_bfloat16, kStages, false, true, false, true>(q_q, k_q, v_t, v_low_t, p, bh, stream)
                          : launch<D, EXPCAST, VSMOOTH, __half, kStages, false, true, false, true>(q_q, k_q, v_t, v_low_t, p, bh, stream);
      } else {  // fidelity's paired-K exp2 loop (the exp2 one-mean loop, a variant, has no lane kernel)
        if (lanes && pair_k && !(pair_means && has_step_mean(D, EXPCAST, VSMOOTH)))
          return out_bf16 ? launch<D, EXPCAST, VSMOOTH, __nv_bfloat16, kStages, false, false, true, true>(q_q, k_q, v_t, v_low_t, p, bh, stream)
                          : launch<D, EXPCAST, VSMOOTH, __half, kStages, false, false, true, true>(q_q, k_q, v_t, v_low_t, p, bh, stream);
      }
    }
    if (lanes) return fail("this build has no kernel with K scales per lane for this head dim and mode");
    if constexpr (!LOWRANK && has_step_mean(D, EXPCAST, VSMOOTH)) {
      if (pair_means)
        return out_bf16 ? launch<D, EXPCAST, VSMOOTH, __nv_bfloat16, kStages, false, true>(q_q, k_q, v_t, v_low_t, p, bh, stream)
                        : launch<D, EXPCAST, VSMOOTH, __half, kStages, false, true>(q_q, k_q, v_t, v_low_t, p, bh, stream);
    }
    if constexpr (!LOWRANK && has_k_pair_exp2(D, EXPCAST, VSMOOTH)) {
      if (pair_k)
        return out_bf16 ? launch<D, EXPCAST, VSMOOTH, __nv_bfloat16, kStages, false, false, true>(q_q, k_q, v_t, v_low_t, p, bh, stream)
                        : launch<D, EXPCAST, VSMOOTH, __half, kStages, false, false, true>(q_q, k_q, v_t, v_low_t, p, bh, stream);
    }
    return out_bf16 ? launch<D, EXPCAST, VSMOOTH, __nv_bfloat16, kStages, LOWRANK, false>(q_q, k_q, v_t, v_low_t, p, bh, stream)
                    : launch<D, EXPCAST, VSMOOTH, __half, kStages, LOWRANK, false>(q_q, k_q, v_t, v_low_t, p, bh, stream);
  }
}

template <int D, bool LOWRANK>
int launch_d(const void* q_q, const void* k_q, const void* v_t, const void* v_low_t, const Params& p, int bh,
             bool expcast, bool vsmooth, bool pair_means, bool pair_k, bool lanes, bool mixed, bool out_bf16,
             cudaStream_t stream) {
  if (expcast && mixed) return fail("the mixed encoding is an exp2-family encoding: expcast must be 0");
  if (expcast)
    return vsmooth ? launch_out<D, true, true, LOWRANK>(q_q, k_q, v_t, v_low_t, p, bh, out_bf16, pair_means, pair_k, lanes, false, stream)
                   : launch_out<D, true, false, LOWRANK>(q_q, k_q, v_t, v_low_t, p, bh, out_bf16, false, false, lanes, false, stream);
  return vsmooth ? launch_out<D, false, true, LOWRANK>(q_q, k_q, v_t, v_low_t, p, bh, out_bf16, pair_means, pair_k, lanes, mixed, stream)
                 : launch_out<D, false, false, LOWRANK>(q_q, k_q, v_t, v_low_t, p, bh, out_bf16, false, false, lanes, mixed, stream);
}

}  // namespace
}  // namespace vc_sm90

extern "C" {

#if VC_SM90_SPLIT && VC_SM90_CONSUMERS == 2
int vc_sm90_forward_c3(const void* q_q, const float* q_scale, const void* k_q, const float* k_scale, const void* v_t,
                       const float* v_scale, const void* v_mean, void* out, int batch, int heads, int n, int n_pad,
                       int head_dim, long long out_stride_b, long long out_stride_h, long long out_stride_n,
                       int expcast, int vsmooth, int out_bf16, void* stream);
const char* vc_sm90_last_error_c3();
#endif

// The consumer warpgroups per CTA of the kernel that runs (head_dim, expcast, vsmooth) in this library.
// 0: no kernel for that head dim.
int VC_SM90_EXPORT(vc_sm90_consumers)(int head_dim, int expcast, int vsmooth) {
  if (head_dim != 64 && head_dim != 128) return 0;
  return VC_SM90_SPLIT ? vc_sm90::split_consumers(head_dim, expcast != 0, vsmooth != 0) : vc_sm90::kConsumers;
}

// Keys per online-softmax step of the kernel that runs (head_dim, expcast, vsmooth) in this library (its
// exact emulation: reference offset_block): 256 where the 256-key loop runs, else one 128-key tile. 0: no
// kernel for that head dim.
int VC_SM90_EXPORT(vc_sm90_step_keys)(int head_dim, int expcast, int vsmooth) {
  const int consumers = VC_SM90_EXPORT(vc_sm90_consumers)(head_dim, expcast, vsmooth);
  if (consumers == 0) return 0;
  const int stages = head_dim == 128 ? VC_SM90_STAGES_D128 : VC_SM90_STAGES_D64;
  return vc_sm90::step256(head_dim, consumers, stages) ? 2 * vc_sm90::kBlockN : vc_sm90::kBlockN;
}

// The eighths of every online-softmax step whose keys this library's exp2 kernels encode with the speed chord
// (VC_SM90_EXP2_CHORD_EIGHTHS: reference p="mixed" with that chord_eighths); 0: exp2 for every key (p="exp2").
int VC_SM90_EXPORT(vc_sm90_chord_eighths)() { return VC_SM90_EXP2_CHORD_EIGHTHS; }

// 1 where this library runs (head_dim, expcast, vsmooth) with the low-rank V term (vc_sm90_forward_low_rank).
int VC_SM90_EXPORT(vc_sm90_low_rank)(int head_dim, int expcast, int vsmooth) {
  if (head_dim != 64 && head_dim != 128) return 0;
  return vc_sm90::has_low_rank(head_dim, expcast != 0, vsmooth != 0) ? 1 : 0;
}

// 1 where this library's kernel for (head_dim, expcast, vsmooth) without the low-rank term takes one K scale per
// 256-key step, so the K scales must be equal in 128-key pairs (VCConfig.k_scale_rows 256): the speed loop with
// VC_SM90_KPAIR when the means are paired (vsmooth 2, which the callers send only with paired K scales), and
// fidelity's exp2 256-key loop in VC_SM90_KPAIR_EXP2 builds when vsmooth carries kVsmoothPairedK.
int VC_SM90_EXPORT(vc_sm90_k_pairs)(int head_dim, int expcast, int vsmooth) {
  const int v_mode = vsmooth & ~(vc_sm90::kVsmoothPairedK | vc_sm90::kVsmoothKLanes);
  if (head_dim != 128 || v_mode == 0) return 0;
  const int consumers = VC_SM90_EXPORT(vc_sm90_consumers)(head_dim, expcast, 1);
  if (!vc_sm90::step256(head_dim, consumers, VC_SM90_STAGES_D128) || consumers != vc_sm90::kConsumers) return 0;
  if (expcast) return VC_SM90_KPAIR && v_mode == vc_sm90::kVsmoothPairMeans && vc_sm90::has_step_mean(head_dim, true, true) ? 1 : 0;
  const bool step_mean = v_mode == vc_sm90::kVsmoothPairMeans && vc_sm90::has_step_mean(head_dim, false, true);
  return (vsmooth & vc_sm90::kVsmoothPairedK) && !step_mean && vc_sm90::has_k_pair_exp2(head_dim, false, true) ? 1 : 0;
}

// 1 where this library runs (head_dim, expcast) with K scales per lane (VCConfig.k_lane_scales) when the forward's vsmooth
// carries kVsmoothPairedK + kVsmoothKLanes (and 2 for ExpCast, whose lane kernel is the one-mean-per-step loop)
int VC_SM90_EXPORT(vc_sm90_k_lanes)(int head_dim, int expcast) {
  if (head_dim != 128) return 0;
  const int consumers = VC_SM90_EXPORT(vc_sm90_consumers)(head_dim, expcast, 1);
  return consumers == vc_sm90::kConsumers && vc_sm90::has_k_lanes(head_dim, expcast != 0, true) ? 1 : 0;
}

// 1 where this library restores one V-Smooth mean per 256-key step for (head_dim, expcast) when the means
// are equal in pairs (vsmooth = 2 in the forward calls; has_step_mean).
int VC_SM90_EXPORT(vc_sm90_step_mean)(int head_dim, int expcast) {
  if (head_dim != 64 && head_dim != 128) return 0;
  return vc_sm90::has_step_mean(head_dim, expcast != 0, true) ? 1 : 0;
}

// The forward with V-Smooth's low-rank term: v_low_t (B,H,8,n_pad) e4m3, v_low_basis (B,H,v_rank,D) fp16,
// v_low_scale (B,H,v_rank) float32; v_rank 0 is the plain forward. v_seg_end (B,H,n_pad/128) uint8: the
// V-Smooth segment ends (VCConfig.v_mean_merge) for the one-mean-per-step kernels, or nullptr (every step). Returns 0 on success, else non-zero
// with vc_sm90_last_error() describing the failure.
static int forward_impl(const void* q_q, const float* q_scale, const void* k_q, const float* k_scale, const void* v_t,
                        const float* v_scale, const void* v_mean, const void* v_low_t, const void* v_low_basis,
                        const float* v_low_scale, int v_rank, void* out, int batch, int heads, int n, int n_pad,
                        int head_dim, long long out_stride_b, long long out_stride_h, long long out_stride_n, int expcast,
                        int vsmooth, int out_bf16, void* stream, const void* v_seg_end, const void* v_lo_t,
                        const int* v_lo_sel, int v_lo_rows, int mixed) {
  using namespace vc_sm90;
  // vsmooth: 0 per-channel V, 1 V-Smooth, 2 its means equal in 128-row pairs, each of 1 and 2 plus kVsmoothPairedK
  if (!vc::valid_vsmooth(vsmooth))
    return fail("bad vsmooth: 0 (per-channel V), 1 or 2 (V-Smooth), the latter two optionally plus 4 (paired K scales), "
                "that plus 8 (K scales per lane)");
  const int v_mode = vsmooth & ~(kVsmoothPairedK | kVsmoothKLanes);
#if VC_SM90_SPLIT && VC_SM90_CONSUMERS == 2
  if (split_consumers(head_dim, expcast != 0, vsmooth != 0) == 3) {
    if (v_rank != 0) return fail("this build has no low-rank V kernel for this head dim and mode");
    if (v_lo_t != nullptr) return fail("the V residual's second term runs in fidelity's paired-K kernel only");
    if (mixed) return fail("the mixed encoding runs in fidelity's paired-K kernel only");
    const int rc = vc_sm90_forward_c3(q_q, q_scale, k_q, k_scale, v_t, v_scale, v_mean, out, batch, heads, n, n_pad,
                                      head_dim, out_stride_b, out_stride_h, out_stride_n, expcast, vsmooth, out_bf16,
                                      stream);
    return rc == 0 ? 0 : fail(vc_sm90_last_error_c3());
  }
#endif
  if (n < 1 || n_pad % kBlockN != 0 || n_pad < n || n_pad - n >= kBlockN) return fail("bad sequence length / padding");
  if (v_rank < 0 || v_rank > vc::kMaxVRank || (v_rank > 0 && (v_low_t == nullptr || v_low_basis == nullptr || v_low_scale == nullptr)))
    return fail("bad low-rank V operands");
  vc_sm90::Params p{};
  p.q_scale = q_scale;
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  p.v_mean = static_cast<const __half*>(v_mean);
  p.out = out;
  p.out_stride_b = out_stride_b;
  p.out_stride_h = out_stride_h;
  p.out_stride_n = out_stride_n;
  p.heads = heads;
  p.n = n;
  p.n_pad = n_pad;
  p.v_low_basis = static_cast<const __half*>(v_low_basis);
  p.v_low_scale = v_low_scale;
  p.v_rank = v_rank;
  // V-Smooth segments: read by the one-mean-per-step kernels only (vsmooth 2); the others restore per tile
  p.v_seg_end = static_cast<const uint8_t*>(v_seg_end);
  // the residual's second term: the kernels this build instantiates with it (VC_SM90_V_LO, or the product's refined
  // kernels, vc::kSm90VLoChannels rows) read it
  if (VC_SM90_V_LO == 0 && vc::kSm90VLoChannels == 0 && (v_lo_t != nullptr || v_lo_sel != nullptr))
    return fail("this build has no kernel with the V residual's second term");
  if ((v_lo_t == nullptr) != (v_lo_sel == nullptr) || (v_lo_t == nullptr) != (v_lo_rows == 0))
    return fail("the V residual's second term needs v_lo_t, v_lo_sel and its channel count together");
  // the kernels read exactly their own VLO rows per tile: operands of another channel count are refused
  if (v_lo_t != nullptr && v_lo_rows != (VC_SM90_V_LO ? VC_SM90_V_LO : vc::kSm90VLoChannels))
    return fail("the V residual's second term has another channel count than this library's kernels take "
                "(vc_sm90_call_v_lo_channels)");
  p.v_lo_sel = v_lo_sel;  // (nullptr without it: the kernels that cannot take it refuse a call that passes it)
  if (v_lo_t != nullptr) {
    if (v_rank) return fail("the V residual's second term takes no low-rank term");
    v_low_t = v_lo_t;  // the kernels that read it (v_lo_kernel) have no low-rank rows: the same map slot
  }
  const int bh = batch * heads;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // v_mode 2: V-Smooth means equal in 128-row pairs (VCConfig.v_mean_rows = 256); kVsmoothPairedK: the K scales too
  const bool e = expcast != 0, vs = v_mode != 0, pairs = v_mode == kVsmoothPairMeans, bf = out_bf16 != 0;
  const bool pk = (vsmooth & kVsmoothPairedK) != 0, lanes = (vsmooth & kVsmoothKLanes) != 0, mx = mixed != 0;
  if (lanes && v_rank) return fail("K scales per lane take no low-rank V term");
  if (head_dim == 128)
    return v_rank ? launch_d<128, true>(q_q, k_q, v_t, v_low_t, p, bh, e, vs, pairs, pk, lanes, mx, bf, s)
                  : launch_d<128, false>(q_q, k_q, v_t, v_low_t, p, bh, e, vs, pairs, pk, lanes, mx, bf, s);
  if (head_dim == 64)
    return v_rank ? launch_d<64, true>(q_q, k_q, v_t, v_low_t, p, bh, e, vs, pairs, pk, lanes, mx, bf, s)
                  : launch_d<64, false>(q_q, k_q, v_t, v_low_t, p, bh, e, vs, pairs, pk, lanes, mx, bf, s);
  return fail("head_dim must be 64 or 128");
}

int VC_SM90_EXPORT(vc_sm90_forward_low_rank)(const void* q_q, const float* q_scale, const void* k_q,
                                             const float* k_scale, const void* v_t, const float* v_scale,
                                             const void* v_mean, const void* v_low_t, const void* v_low_basis,
                                             const float* v_low_scale, int v_rank, void* out, int batch, int heads,
                                             int n, int n_pad, int head_dim, long long out_stride_b,
                                             long long out_stride_h, long long out_stride_n, int expcast, int vsmooth,
                                             int out_bf16, void* stream, const void* v_seg_end) {
  return forward_impl(q_q, q_scale, k_q, k_scale, v_t, v_scale, v_mean, v_low_t, v_low_basis, v_low_scale, v_rank, out,
                      batch, heads, n, n_pad, head_dim, out_stride_b, out_stride_h, out_stride_n, expcast, vsmooth,
                      out_bf16, stream, v_seg_end, nullptr, nullptr, 0, 0);
}

// The channels of the V residual's second term this library's fidelity kernel takes (VC_SM90_V_LO; 0: none).
int VC_SM90_EXPORT(vc_sm90_v_lo_channels)() { return VC_SM90_V_LO; }

// The forward with the V residual's second term (VC_SM90_V_LO builds; VCConfig.v_lo_channels): v_lo_t (B,H,L,n_pad)
// e4m3, v_lo_sel (B,H,L) int32 distinct channel indices in [0, head_dim), L = vc_sm90_v_lo_channels() in a variant build
// (vc_sm90_call_v_lo_channels() in the product's, whose refined kernels this entry then runs with exp2 P). Fidelity's
// paired-K exp2 kernel reads them; a call that would run another kernel is refused (the term is never dropped).
int VC_SM90_EXPORT(vc_sm90_forward_v_lo)(const void* q_q, const float* q_scale, const void* k_q, const float* k_scale,
                                         const void* v_t, const float* v_scale, const void* v_mean, const void* v_lo_t,
                                         const int* v_lo_sel, void* out, int batch, int heads, int n, int n_pad,
                                         int head_dim, long long out_stride_b, long long out_stride_h,
                                         long long out_stride_n, int expcast, int vsmooth, int out_bf16, void* stream) {
  if (v_lo_t == nullptr || v_lo_sel == nullptr) return vc_sm90::fail("v_lo_t and v_lo_sel are required");
  return forward_impl(q_q, q_scale, k_q, k_scale, v_t, v_scale, v_mean, nullptr, nullptr, nullptr, 0, out, batch, heads,
                      n, n_pad, head_dim, out_stride_b, out_stride_h, out_stride_n, expcast, vsmooth, out_bf16, stream,
                      nullptr, v_lo_t, v_lo_sel, VC_SM90_V_LO ? VC_SM90_V_LO : vc::kSm90VLoChannels, 0);
}

// The refinements this library takes per call (vc_sm90_forward_all), beside the kernels without them: the channels of
// the V residual's second term (vc::kSm90VLoChannels) and the chord eighths of the mixed encoding
// (vc::kMixedChordEighths); 0 and 0 in a variant build whose kernels carry VC_SM90_V_LO / VC_SM90_EXP2_CHORD_EIGHTHS.
int VC_SM90_EXPORT(vc_sm90_call_v_lo_channels)() {
  return vc_sm90::has_refined_kernels(128, false, true) ? vc::kSm90VLoChannels : 0;
}
int VC_SM90_EXPORT(vc_sm90_call_chord_eighths)() {
  return vc_sm90::has_refined_kernels(128, false, true) ? vc::kMixedChordEighths : 0;
}

// The forward with every operand (vc::Sm90ForwardFn, which the prepare extension's prepare_attend calls): the
// low-rank term (v_low_t, v_low_basis, v_low_scale, v_rank), the V-Smooth segment ends (v_seg_end), the V residual's
// second term (v_lo_t (B,H,L,n_pad) e4m3 and v_lo_sel (B,H,L) int32, v_lo_rows = L = vc_sm90_call_v_lo_channels();
// nullptr, nullptr, 0: without it) and mixed (1: the mixed P encoding, p="mixed", with expcast 0). A refinement this call's kernel lacks
// is refused, never dropped.
int VC_SM90_EXPORT(vc_sm90_forward_all)(const void* q_q, const float* q_scale, const void* k_q, const float* k_scale,
                                        const void* v_t, const float* v_scale, const void* v_mean, const void* v_low_t,
                                        const void* v_low_basis, const float* v_low_scale, int v_rank, void* out,
                                        int batch, int heads, int n, int n_pad, int head_dim, long long out_stride_b,
                                        long long out_stride_h, long long out_stride_n, int expcast, int vsmooth,
                                        int out_bf16, void* stream, const void* v_seg_end, const void* v_lo_t,
                                        const int* v_lo_sel, int v_lo_rows, int mixed) {
  return forward_impl(q_q, q_scale, k_q, k_scale, v_t, v_scale, v_mean, v_low_t, v_low_basis, v_low_scale, v_rank, out,
                      batch, heads, n, n_pad, head_dim, out_stride_b, out_stride_h, out_stride_n, expcast, vsmooth,
                      out_bf16, stream, v_seg_end, v_lo_t, v_lo_sel, v_lo_rows, mixed);
}

// Returns 0 on success, else non-zero with vc_sm90_last_error() describing the failure. vsmooth (here and in
// vc_sm90_forward_low_rank): 0 per-channel V, 1 V-Smooth, 2 V-Smooth whose block means are equal in 128-row
// pairs (the prepare's v_mean_rows = 256): the speed kernel then restores one mean per 256-key step; 1 and 2 may
// add kVsmoothPairedK (the K scales equal in 128-key pairs: fidelity's exp2 loop then reads one per step).
int VC_SM90_EXPORT(vc_sm90_forward)(const void* q_q, const float* q_scale, const void* k_q, const float* k_scale,
                                    const void* v_t, const float* v_scale, const void* v_mean, void* out, int batch,
                                    int heads, int n, int n_pad, int head_dim, long long out_stride_b,
                                    long long out_stride_h, long long out_stride_n, int expcast, int vsmooth,
                                    int out_bf16, void* stream) {
  return VC_SM90_EXPORT(vc_sm90_forward_low_rank)(q_q, q_scale, k_q, k_scale, v_t, v_scale, v_mean, nullptr, nullptr,
                                                  nullptr, 0, out, batch, heads, n, n_pad, head_dim, out_stride_b,
                                                  out_stride_h, out_stride_n, expcast, vsmooth, out_bf16, stream, nullptr);
}

const char* VC_SM90_EXPORT(vc_sm90_last_error)() { return vc_sm90::g_error; }

}  // extern "C"
