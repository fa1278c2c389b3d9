// The per-capability widen_add variants against ATen: bitwise what dst.add_(src) (float32 add
// after an exact widening) and zeros + src give, for bfloat16 and float16 sources with special
// values (-0, subnormals, infinities, NaN), lengths with vector tails, and any thread count.
#include "mixtrain/optim/kernels/widen_add_kernel.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "mixtrain/core/cpu_capability.h"
#include "support/kernel_variants.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using Kernel = void (*)(float*, const void*, c10::ScalarType, int64_t, bool);

using ::mixtrain::testing::same_bits;

std::vector<::mixtrain::testing::KernelVariant<Kernel>> supported_variants() {
  return ::mixtrain::testing::runnable_variants<Kernel>(DEFAULT::widen_add, AVX2::widen_add,
                                                        AVX512::widen_add);
}

// Random values of the dtype with special bit patterns spread through them.
at::Tensor source(int64_t n, at::ScalarType dtype) {
  at::Tensor t = (at::randn({n}) * 3).to(dtype);
  const int16_t specials[] = {static_cast<int16_t>(0x8000),  // -0
                              0x0001,                        // smallest subnormal
                              dtype == at::kBFloat16 ? int16_t{0x7F80} : int16_t{0x7C00},  // +inf
                              dtype == at::kBFloat16
                                  ? static_cast<int16_t>(0xFFC1)  // -NaN with payload
                                  : static_cast<int16_t>(0xFE01)};
  at::Tensor bits = t.view(at::kShort);
  for (int64_t i = 0; i < n; i += 7) bits[i] = specials[(i / 7) % 4];
  return t;
}

TEST(WidenAddKernelTest, MatchesATenBitwise) {
  at::manual_seed(5);
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{33}, int64_t{200003}}) {
      const at::Tensor src = source(n, dtype);
      const at::Tensor dst0 = at::randn({n});
      const at::Tensor added = dst0.clone().add_(src);
      const at::Tensor overwritten = at::zeros({n}).add_(src);
      for (const auto& v : supported_variants()) {
        at::Tensor dst = dst0.clone();
        v.kernel(dst.data_ptr<float>(), src.data_ptr(), dtype, n, /*overwrite=*/false);
        EXPECT_TRUE(same_bits(dst, added))
            << "add, n=" << n << " " << dtype << " " << cpu_capability_name(v.capability);
        dst = at::full({n}, 42.0f);  // overwritten regardless of what was there
        v.kernel(dst.data_ptr<float>(), src.data_ptr(), dtype, n, /*overwrite=*/true);
        EXPECT_TRUE(same_bits(dst, overwritten))
            << "overwrite, n=" << n << " " << dtype << " " << cpu_capability_name(v.capability);
      }
    }
  }
}

TEST(WidenAddKernelTest, OverwriteTurnsNegativeZeroPositive) {
  at::Tensor src = at::empty({1}, at::kShort);
  src[0] = static_cast<int16_t>(0x8000);  // bfloat16 -0
  for (const auto& v : supported_variants()) {
    float dst = -1.0f;
    v.kernel(&dst, src.data_ptr(), at::kBFloat16, 1, /*overwrite=*/true);
    EXPECT_EQ(dst, 0.0f);
    EXPECT_FALSE(std::signbit(dst)) << cpu_capability_name(v.capability);
  }
}

TEST(WidenAddKernelTest, ResultDoesNotDependOnTheThreadCount) {
  at::manual_seed(6);
  const int64_t n = 5 * (1 << 16) + 77;
  const at::Tensor src = source(n, at::kBFloat16);
  const at::Tensor dst0 = at::randn({n});
  const int threads_before = at::get_num_threads();
  for (const auto& v : supported_variants()) {
    at::set_num_threads(1);
    at::Tensor one = dst0.clone();
    v.kernel(one.data_ptr<float>(), src.data_ptr(), at::kBFloat16, n, false);
    for (int threads : {2, 3}) {
      at::set_num_threads(threads);
      at::Tensor many = dst0.clone();
      v.kernel(many.data_ptr<float>(), src.data_ptr(), at::kBFloat16, n, false);
      EXPECT_TRUE(same_bits(many, one)) << threads << " threads";
    }
  }
  at::set_num_threads(threads_before);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
