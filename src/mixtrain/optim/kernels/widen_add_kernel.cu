// CUDA twin of widen_add_kernel.cpp (contract in widen_add_kernel.h): a grid-stride loop, one
// exact widening and one __fadd_rn per element, so the bits do not depend on the launch shape.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "mixtrain/optim/kernels/widen_add_kernel.h"

namespace mixtrain {
namespace CUDA {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

__device__ __forceinline__ float widened(const uint16_t* src, int64_t i, bool bfloat16) {
  if (bfloat16) return __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
  return __half2float(__ushort_as_half(src[i]));
}

__global__ void __launch_bounds__(kThreads)
    widen_add_kernel(float* dst, const uint16_t* src, bool bfloat16, int64_t n, bool overwrite) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    // overwrite: 0 + x, as a zero-filled dst would give (-0 becomes +0)
    dst[i] = __fadd_rn(overwrite ? 0.0f : dst[i], widened(src, i, bfloat16));
  }
}

}  // namespace

void widen_add(float* dst, const void* src, c10::ScalarType dtype, int64_t n, bool overwrite,
               void* stream) {
  if (dtype != c10::ScalarType::BFloat16 && dtype != c10::ScalarType::Half) {
    throw std::invalid_argument("widen_add (CUDA): src dtype must be bfloat16 or float16");
  }
  if (n <= 0) return;
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  widen_add_kernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                     static_cast<cudaStream_t>(stream)>>>(
      dst, static_cast<const uint16_t*>(src), dtype == c10::ScalarType::BFloat16, n, overwrite);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("widen_add (CUDA): launch failed: ") +
                             cudaGetErrorString(status));
  }
}

}  // namespace CUDA
}  // namespace mixtrain
