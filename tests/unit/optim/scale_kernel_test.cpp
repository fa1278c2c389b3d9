// The per-capability scale_many variants against ATen: bitwise what t.mul_(double) gives a
// float32 tensor, for several arrays in one call (lengths with vector tails, one above the
// parallel grain), factors that round when cast to float, special values (-0, subnormals,
// infinities, NaN), and any thread count.
#include "mixtrain/optim/kernels/scale_kernel.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "mixtrain/core/cpu_capability.h"
#include "support/kernel_variants.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using Kernel = void (*)(float* const*, const int64_t*, int64_t, float);

using ::mixtrain::testing::same_bits;

std::vector<::mixtrain::testing::KernelVariant<Kernel>> supported_variants() {
  return ::mixtrain::testing::runnable_variants<Kernel>(DEFAULT::scale_many, AVX2::scale_many,
                                                        AVX512::scale_many);
}

at::Tensor values(int64_t n) {
  at::Tensor t = at::randn({n}) * 5;
  const float specials[] = {-0.0f, std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::quiet_NaN(), 3.4e38f};
  for (int64_t i = 0; i < n; i += 9) t[i] = specials[(i / 9) % 5];
  return t;
}

TEST(ScaleKernelTest, MatchesATenMulBitwise) {
  at::manual_seed(11);
  const std::vector<int64_t> lengths = {1, 15, 16, 33, 200003, 0, 7};
  // 0.1 and 1/3 are not floats: the cast rounds them, as ATen's mul_ casts its scalar.
  for (const double factor : {0.1, 1.0 / 3.0, 0.7071067811865476, 1e-30}) {
    for (const auto& v : supported_variants()) {
      for (const int threads : {1, 2}) {
        at::set_num_threads(threads);
        std::vector<at::Tensor> mine, expected;
        std::vector<float*> data;
        std::vector<int64_t> sizes;
        for (const int64_t n : lengths) {
          const at::Tensor t = values(n);
          expected.push_back(t.clone().mul_(factor));
          mine.push_back(t.clone());
          data.push_back(mine.back().data_ptr<float>());
          sizes.push_back(n);
        }
        v.kernel(data.data(), sizes.data(), static_cast<int64_t>(data.size()),
                 static_cast<float>(factor));
        for (size_t i = 0; i < mine.size(); ++i) {
          EXPECT_TRUE(same_bits(mine[i], expected[i]))
              << "capability " << static_cast<int>(v.capability) << ", factor " << factor
              << ", length " << lengths[i] << ", threads " << threads;
        }
      }
    }
  }
  at::set_num_threads(1);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
