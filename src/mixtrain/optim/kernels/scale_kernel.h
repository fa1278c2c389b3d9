// In-place scaling of float32 tensors by one factor (gradient clipping's coefficient): the
// per-capability kernel variants.
//
// scale_kernel.cpp is compiled once per capability (docs/architecture.md §1), defining
// scale_many in namespaces DEFAULT, AVX2 and AVX512; callers dispatch with select_kernel()
// (core/cpu_capability.h).
//
// Contract of scale_many(data, sizes, count, factor): for each of the `count` arrays data[t] of
// sizes[t] float32 elements, data[t][i] = data[t][i] * factor, one float32 multiplication per
// element: the bits of ATen's tensor.mul_(double d) on a float32 tensor with factor = float(d)
// (ATen multiplies by the scalar cast to the tensor's dtype). All arrays in one call, where ATen
// pays one dispatched op (and the wrapped scalar's casts) per tensor; threads split each array's
// range with at::parallel_for; the result does not depend on the split. CPU only: on a GPU the
// clip scales each gradient with its own mul_ (optim/grad_clip.cpp).
#pragma once

#include <cstdint>

namespace mixtrain {

namespace DEFAULT {
void scale_many(float* const* data, const int64_t* sizes, int64_t count, float factor);
}  // namespace DEFAULT
namespace AVX2 {
void scale_many(float* const* data, const int64_t* sizes, int64_t count, float factor);
}  // namespace AVX2
namespace AVX512 {
void scale_many(float* const* data, const int64_t* sizes, int64_t count, float factor);
}  // namespace AVX512

}  // namespace mixtrain
