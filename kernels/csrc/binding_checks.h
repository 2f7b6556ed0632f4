// Tensor checks shared by the torch bindings (attn_mma_binding.cpp, prepare_binding.cpp,
// sm90_binding.cpp may use them too): one readable sentence per violated precondition.
#pragma once
#include <torch/extension.h>

#include <cstdint>

#include "refusal_text.h"
#include "vc_constants.h"

namespace vc {

inline void check_cuda_contiguous(const torch::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.is_cuda(), vc::text(name, " must be a CUDA tensor."));
  TORCH_CHECK_VALUE(t.is_contiguous(), vc::text(name, " must be contiguous."));
}

inline void fill_strides(int64_t (&dst)[3], const torch::Tensor& t) {
  for (int i = 0; i < 3; ++i) dst[i] = t.stride(i);
}

// k_scale's size as the attention kernels read it: one scale per 128-key tile, or four with K scales per MMA lane
// (VCConfig.k_lane_scales); lanes_from names where the caller learned the lanes (ends the refusal's sentence)
inline void check_k_scale(const torch::Tensor& k_scale, int64_t tiles, bool lanes, const char* lanes_from) {
  if (lanes) {
    TORCH_CHECK_VALUE(k_scale.numel() == tiles * kKLanes,
                      vc::text("k_scale must be (B, H, n_pad / 128, 4) with K scales per lane", lanes_from, "."));
  } else {
    TORCH_CHECK_VALUE(k_scale.numel() == tiles, "k_scale must be (B, H, n_pad / 128).");
  }
}

inline void raise_on_error(const char* err, const char* what) { TORCH_CHECK(err == nullptr, vc::text(what, " launch failed: ", err)); }

}  // namespace vc
