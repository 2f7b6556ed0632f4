// Tensor checks shared by the torch bindings (attn_mma_binding.cpp, prepare_binding.cpp,
// sm90_binding.cpp may use them too): one readable sentence per violated precondition.
#pragma once
#include <torch/extension.h>

#include <cstdint>

#include "refusal_text.h"

namespace vc {

inline void check_cuda_contiguous(const torch::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.is_cuda(), vc::text(name, " must be a CUDA tensor."));
  TORCH_CHECK_VALUE(t.is_contiguous(), vc::text(name, " must be contiguous."));
}

inline void fill_strides(int64_t (&dst)[3], const torch::Tensor& t) {
  for (int i = 0; i < 3; ++i) dst[i] = t.stride(i);
}

inline void raise_on_error(const char* err, const char* what) { TORCH_CHECK(err == nullptr, vc::text(what, " launch failed: ", err)); }

}  // namespace vc
