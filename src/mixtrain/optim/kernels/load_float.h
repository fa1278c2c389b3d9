// Loads Vectorized<float>::size() consecutive float32, bfloat16 or float16 values as float32
// (exact widening), for the kernel files compiled once per capability. Include it inside no
// namespace: it opens mixtrain::CPU_CAPABILITY itself, with internal linkage, so each
// capability's copy stays its own (see sum_of_squares_kernel.cpp on weak symbols).
#pragma once

#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace mixtrain {
namespace CPU_CAPABILITY {
namespace {

inline at::vec::Vectorized<float> load_float(const float* p) {
  return at::vec::Vectorized<float>::loadu(p);
}
inline at::vec::Vectorized<float> load_float(const c10::BFloat16* p) {
  at::vec::Vectorized<float> out;
  at::vec::load_fp32_from_bf16(p, out);
  return out;
}
inline at::vec::Vectorized<float> load_float(const c10::Half* p) {
  at::vec::Vectorized<float> out;
  at::vec::load_fp32_from_fp16(p, out);
  return out;
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace mixtrain
