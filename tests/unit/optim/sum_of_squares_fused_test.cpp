// optim/sum_of_squares_fused.h on the CPU: which tensors the pass takes, and the sum over a
// list of mixed dtypes and strides against an independent float64 sum (the kernel's own cases are
// sum_of_squares_kernel_test's; the CUDA twin's, sum_of_squares_kernel_cuda_test's).
#include "mixtrain/optim/sum_of_squares_fused.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(SumOfSquaresFused, TakesFloatingSixteenAndThirtyTwoBitTensors) {
  EXPECT_TRUE(sum_of_squares_fusable(at::zeros({3})));
  EXPECT_TRUE(sum_of_squares_fusable(at::zeros({3}, at::kBFloat16)));
  EXPECT_TRUE(sum_of_squares_fusable(at::zeros({3}, at::kHalf)));
  EXPECT_TRUE(sum_of_squares_fusable(at::zeros({3, 2}).t()));  // read through a contiguous copy
  EXPECT_FALSE(sum_of_squares_fusable(at::zeros({3}, at::kDouble)));
  EXPECT_FALSE(sum_of_squares_fusable(at::Tensor()));
  EXPECT_THROW(sum_of_squares_fused({at::zeros({3}, at::kDouble)}, at::kCPU), c10::Error);
}

TEST(SumOfSquaresFused, MixedListAgainstADoubleSum) {
  // Small integers: every square and every partial sum is exact in float32 and double, so the
  // kernel's sum is the exact one.
  const std::vector<at::Tensor> list = {
      at::arange(1, 101, at::kFloat), at::arange(-7, 9, at::kFloat).to(at::kBFloat16),
      at::arange(0, 12, at::kFloat).reshape({3, 4}).t().to(at::kHalf), at::zeros({0})};
  double expected = 0;
  for (const auto& t : list) expected += t.to(at::kDouble).square().sum().item<double>();
  const at::Tensor sum = sum_of_squares_fused(list, at::kCPU);
  EXPECT_EQ(sum.scalar_type(), at::kDouble);
  EXPECT_EQ(sum.dim(), 0);
  EXPECT_EQ(sum.item<double>(), expected);
  EXPECT_EQ(sum_of_squares_fused({}, at::kCPU).item<double>(), 0.0);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
