// Compiled three times (CPU_CAPABILITY = DEFAULT, AVX2, AVX512); see the header for the
// contract. No out-of-line inline code outside namespace CPU_CAPABILITY (see
// sum_of_squares_kernel.cpp): dtype errors are the caller's to check.
#include "mixtrain/optim/kernels/widen_add_kernel.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "mixtrain/optim/kernels/vec_float.h"

#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__) && !defined(__clang__)
// GCC 12 false positive in ATen's inlined bf16 conversion (see sum_of_squares_kernel.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace mixtrain {
namespace CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();
constexpr int64_t kGrain = 1 << 16;  // elements per parallel task

template <typename T>
void widen_add_range(float* dst, const T* src, int64_t begin, int64_t end, bool overwrite) {
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    const Vec base = overwrite ? Vec(0.0f) : Vec::loadu(dst + i);
    (base + load_float(src + i)).store(dst + i);
  }
  for (; i < end; ++i) dst[i] = (overwrite ? 0.0f : dst[i]) + static_cast<float>(src[i]);
}

}  // namespace

void widen_add(float* dst, const void* src, c10::ScalarType dtype, int64_t n, bool overwrite) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    if (dtype == c10::ScalarType::BFloat16) {
      widen_add_range(dst, static_cast<const c10::BFloat16*>(src), begin, end, overwrite);
    } else {
      widen_add_range(dst, static_cast<const c10::Half*>(src), begin, end, overwrite);
    }
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace mixtrain
