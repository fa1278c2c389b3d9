// Compiled three times (CPU_CAPABILITY = DEFAULT, AVX2, AVX512); see the header for the
// contract.
#include "mixtrain/optim/kernels/scale_kernel.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

namespace mixtrain {
namespace CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();
constexpr int64_t kGrain = 1 << 16;  // elements per parallel task

void scale_range(float* p, int64_t begin, int64_t end, float factor) {
  const Vec f(factor);
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) (Vec::loadu(p + i) * f).store(p + i);
  for (; i < end; ++i) p[i] = p[i] * factor;
}

}  // namespace

void scale_many(float* const* data, const int64_t* sizes, int64_t count, float factor) {
  for (int64_t t = 0; t < count; ++t) {
    float* p = data[t];
    if (sizes[t] <= kGrain) {  // small: no parallel region to enter
      scale_range(p, 0, sizes[t], factor);
      continue;
    }
    at::parallel_for(0, sizes[t], kGrain,
                     [&](int64_t begin, int64_t end) { scale_range(p, begin, end, factor); });
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace mixtrain
