// optim/widen_add_fused.h on the CPU: which tensors the pass takes, and that it gives the bits
// of ATen's dst.add_(src) / zeros + src through the tensor interface (the kernel's own cases are
// widen_add_kernel_test's; the CUDA twin's, widen_add_kernel_cuda_test's).
#include "mixtrain/optim/widen_add_fused.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

TEST(WidenAddFused, TakesFloat32DestinationsAndSixteenBitSources) {
  const at::Tensor dst = at::zeros({6});
  EXPECT_TRUE(widen_add_fusable(dst, at::zeros({6}, at::kBFloat16)));
  EXPECT_TRUE(widen_add_fusable(dst, at::zeros({6}, at::kHalf)));
  EXPECT_FALSE(widen_add_fusable(dst, at::zeros({6})));             // float32 source
  EXPECT_FALSE(widen_add_fusable(dst, at::zeros({7}, at::kHalf)));  // numel
  EXPECT_FALSE(widen_add_fusable(at::zeros({6}, at::kDouble), at::zeros({6}, at::kHalf)));
  EXPECT_FALSE(widen_add_fusable(dst, at::zeros({6, 2}, at::kHalf).select(1, 0)));  // strided
  EXPECT_FALSE(widen_add_fusable(dst, at::Tensor()));
  EXPECT_THROW(widen_add_fused(dst, at::zeros({6}), false), c10::Error);
}

TEST(WidenAddFused, BitwiseTheAtenAdd) {
  at::manual_seed(5);
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    const at::Tensor src = at::randn({1001}).to(dtype);
    const at::Tensor dst0 = at::randn({1001});
    at::Tensor dst = dst0.clone();
    const auto version = dst._version();
    widen_add_fused(dst, src, /*overwrite=*/false);
    EXPECT_TRUE(same_bits(dst, dst0.clone().add_(src))) << dtype;
    EXPECT_GT(dst._version(), version) << "written in place: the version counter moves";
    at::Tensor fresh = at::full({1001}, 7.0f);
    widen_add_fused(fresh, src, /*overwrite=*/true);
    EXPECT_TRUE(same_bits(fresh, at::zeros({1001}).add_(src))) << dtype;
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
