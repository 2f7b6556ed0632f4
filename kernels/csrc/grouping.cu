// Launchers of the fused k-means grouping kernels (grouping.cuh): dtype / head-dim dispatch and
// the opt-in to more than 48 KB of dynamic shared memory.
#include <cuda_runtime.h>

#include "grouping.cuh"
#include "grouping_refine.cuh"

namespace vc {

namespace {

// cudaFuncSetAttribute is a host call (not a stream operation), made once per kernel, device and
// size, so the warm-up call before a CUDA-graph capture has already made it.
template <typename Kernel>
cudaError_t allow_shared_memory(Kernel kernel, int64_t bytes, int64_t (&configured)[64]) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 64 && configured[device] >= bytes) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (err == cudaSuccess && device < 64) configured[device] = bytes;
  return err;
}

const char* result(cudaError_t err) {
  if (err == cudaSuccess) err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

template <typename T, int D>
cudaError_t pass_typed(const GroupParams& p, bool accumulate, cudaStream_t stream) {
  static int64_t configured[64] = {};
  const int64_t bytes = group_pass_smem_bytes(D, p.clusters, false);
  const cudaError_t err = allow_shared_memory(group_pass_kernel<T, D>, bytes, configured);
  if (err != cudaSuccess) return err;
  group_pass_kernel<T, D><<<dim3(p.parts, p.batch * p.heads), kPassThreads, bytes, stream>>>(p, accumulate);
  return cudaSuccess;
}

template <int D>
cudaError_t pass_tensor_cores(const GroupParams& p, bool accumulate, cudaStream_t stream) {
  static int64_t configured[64] = {};
  const int64_t bytes = group_pass_smem_bytes(D, p.clusters, true);
  const cudaError_t err = allow_shared_memory(group_pass_tc_kernel<D>, bytes, configured);
  if (err != cudaSuccess) return err;
  group_pass_tc_kernel<D><<<dim3(p.parts, p.batch * p.heads), kPassThreads, bytes, stream>>>(p, accumulate);
  return cudaSuccess;
}

template <typename T>
cudaError_t pass_dim(const GroupParams& p, bool accumulate, cudaStream_t stream) {
  return p.head_dim == 64 ? pass_typed<T, 64>(p, accumulate, stream) : pass_typed<T, 128>(p, accumulate, stream);
}

template <typename T>
void refine_typed(const RefineParams& p, cudaStream_t stream) {
  const dim3 grid(unsigned(p.clusters), unsigned(p.batch * p.heads));
  if (p.head_dim == 64) {
    group_refine_kernel<T, 64><<<grid, kRefineThreads, 0, stream>>>(p);
  } else {
    group_refine_kernel<T, 128><<<grid, kRefineThreads, 0, stream>>>(p);
  }
}

}  // namespace

const char* launch_group_pass(const GroupParams& p, bool accumulate, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.tensor_cores) {  // the binding allows it for bf16 V only
    return result(p.head_dim == 64 ? pass_tensor_cores<64>(p, accumulate, s) : pass_tensor_cores<128>(p, accumulate, s));
  }
  return result(p.input_bf16 ? pass_dim<__nv_bfloat16>(p, accumulate, s) : pass_dim<__half>(p, accumulate, s));
}

const char* launch_group_update(const GroupParams& p, void* stream) {
  constexpr int kThreads = 256;
  const int64_t size = int64_t(p.clusters) * p.head_dim;
  const dim3 grid(unsigned((size + kThreads - 1) / kThreads), unsigned(p.batch * p.heads));
  group_update_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return result(cudaSuccess);
}

const char* launch_group_order(const GroupParams& p, bool chain, void* stream) {
  static int64_t configured[64] = {};
  const int64_t bytes = group_order_smem_bytes(p.head_dim, p.clusters);
  const cudaError_t err = allow_shared_memory(group_order_kernel, bytes, configured);
  if (err != cudaSuccess) return result(err);
  group_order_kernel<<<p.batch * p.heads, kOrderThreads, bytes, static_cast<cudaStream_t>(stream)>>>(p, chain);
  return result(cudaSuccess);
}

const char* launch_group_label_counts(const GroupParams& p, void* stream) {
  group_label_counts_kernel<<<dim3(p.parts, p.batch * p.heads), kPermThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return result(cudaSuccess);
}

const char* launch_group_permute(const GroupParams& p, void* stream) {
  group_permute_kernel<<<dim3(p.parts, p.batch * p.heads), kPermThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return result(cudaSuccess);
}

const char* launch_group_refine(const RefineParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.input_bf16) {
    refine_typed<__nv_bfloat16>(p, s);
  } else {
    refine_typed<__half>(p, s);
  }
  return result(cudaSuccess);
}

}  // namespace vc
