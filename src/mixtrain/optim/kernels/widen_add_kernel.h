// main_grad accumulation of a 16-bit gradient: the per-capability kernel variants.
//
// widen_add_kernel.cpp is compiled once per capability (docs/architecture.md §1), defining
// widen_add in namespaces DEFAULT, AVX2 and AVX512; callers dispatch with select_kernel()
// (core/cpu_capability.h).
//
// Contract of widen_add(dst, src, dtype, n, overwrite): for i < n,
//   dst[i] = (overwrite ? 0.0f : dst[i]) + float(src[i])
// with src bfloat16 or float16 (converted exactly) and one float32 addition per element, so the
// bits are those of ATen's dst.add_(src) (a float32 add after an exact widening) and, with
// overwrite, of a zero-filled dst plus src (-0 becomes +0). One pass over the bytes, where ATen's
// mixed-dtype add first copies src into a float32 temporary. Threads split the range with
// at::parallel_for; the result does not depend on the split.
//
// CUDA::widen_add (widen_add_kernel.cu) is the device twin, bitwise the same: one
// round-to-nearest float addition per element (__fadd_rn) after the same exact widening.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace mixtrain {

namespace DEFAULT {
void widen_add(float* dst, const void* src, c10::ScalarType dtype, int64_t n, bool overwrite);
}  // namespace DEFAULT
namespace AVX2 {
void widen_add(float* dst, const void* src, c10::ScalarType dtype, int64_t n, bool overwrite);
}  // namespace AVX2
namespace AVX512 {
void widen_add(float* dst, const void* src, c10::ScalarType dtype, int64_t n, bool overwrite);
}  // namespace AVX512

namespace CUDA {
// The contract above for device pointers, enqueued on `stream` (a cudaStream_t of their device,
// the current device); returns without waiting. dtype must be kBFloat16 or kHalf
// (std::invalid_argument otherwise); std::runtime_error when the launch fails.
void widen_add(float* dst, const void* src, c10::ScalarType dtype, int64_t n, bool overwrite,
               void* stream);
}  // namespace CUDA

}  // namespace mixtrain
