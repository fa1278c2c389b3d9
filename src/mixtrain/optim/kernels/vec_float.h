// Vector loads and stores of float32, bfloat16 and float16 as float32, and a rounding barrier,
// for the kernel files compiled once per capability. Include it inside no namespace: it opens
// mixtrain::CPU_CAPABILITY itself, with internal linkage, so each capability's copy stays its own
// (see sum_of_squares_kernel.cpp on weak symbols).
#pragma once

#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace mixtrain {
namespace CPU_CAPABILITY {
namespace {

// Vectorized<float>::size() consecutive values, widened exactly.
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

// 2 * Vectorized<float>::size() consecutive values, v0 first, rounded to nearest even as ATen's
// to(dtype) rounds (a Vectorized<BFloat16> or <Half> holds two float vectors).
inline void store_float(const at::vec::Vectorized<float>& v0, const at::vec::Vectorized<float>& v1,
                        float* out) {
  v0.store(out);
  v1.store(out + at::vec::Vectorized<float>::size());
}
inline void store_float(const at::vec::Vectorized<float>& v0, const at::vec::Vectorized<float>& v1,
                        c10::BFloat16* out) {
  at::vec::convert_float_bfloat16(v0, v1).store(out);
}
inline void store_float(const at::vec::Vectorized<float>& v0, const at::vec::Vectorized<float>& v1,
                        c10::Half* out) {
  at::vec::convert_float_half(v0, v1).store(out);  // F16C in the vector builds
}

// Returns v, rounded to float here. GCC contracts a product feeding an addition into a fused
// multiply-add (-ffp-contract=fast is its C++ default) wherever the target has FMA; where ATen
// stores a product (x.mul_(c)) before the next op reads it, that product must stay rounded. The
// empty asm makes the value opaque to the optimizer and costs no instruction.
inline at::vec::Vectorized<float> rounded(at::vec::Vectorized<float> v) {
#if defined(CPU_CAPABILITY_AVX512)
  __m512 r = v;
  __asm__("" : "+v"(r));
  return at::vec::Vectorized<float>(r);
#elif defined(CPU_CAPABILITY_AVX2)
  __m256 r = v;
  __asm__("" : "+x"(r));
  return at::vec::Vectorized<float>(r);
#else
  return v;  // no FMA instructions in the baseline x86-64 build: nothing can be fused
#endif
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace mixtrain
