// global_grad_norm / clip_grad_norm against values computed here in double, and the clipping
// rule of torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6), applied only
// when < 1).
//
// Norm tolerance: 1e-5 relative. The kernel's float32 lanes add at most 64 squares before the
// double flush, a worst-case relative error of ~4e-6 on the sum (half that on the norm).
#include "mixtrain/optim/grad_clip.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace mixtrain {
namespace {

constexpr double kRelTol = 1e-5;

// sqrt of the sum of squares of the stored values, element by element in double.
double reference_norm(const std::vector<at::Tensor>& tensors) {
  double sum = 0.0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    const at::Tensor f = t.to(at::kDouble).contiguous();  // exact for fp32/bf16/fp16
    const double* p = f.data_ptr<double>();
    for (int64_t i = 0; i < f.numel(); ++i) sum += p[i] * p[i];
  }
  return std::sqrt(sum);
}

TEST(GradClipTest, NormMatchesDoubleReferenceForEveryDtypeAndOddSizes) {
  at::manual_seed(11);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    std::vector<at::Tensor> grads;
    for (int64_t n : {1, 3, 17, 255, 4097, 70001}) grads.push_back(at::randn({n}).to(dtype));
    grads.push_back(at::randn({33, 7}).to(dtype));  // 2-D, 231 elements
    const double expected = reference_norm(grads);
    EXPECT_NEAR(global_grad_norm(grads), expected, kRelTol * expected) << dtype;
  }
}

TEST(GradClipTest, MixedDtypesAndFloat64FallBackToDouble) {
  at::manual_seed(5);
  const std::vector<at::Tensor> grads = {at::randn({100}), at::randn({50}).to(at::kBFloat16),
                                         at::randn({77}, at::kDouble)};
  const double expected = reference_norm(grads);
  EXPECT_NEAR(global_grad_norm(grads), expected, kRelTol * expected);
}

TEST(GradClipTest, UndefinedSkippedAndNonContiguousHandled) {
  at::manual_seed(9);
  const at::Tensor base = at::randn({64, 48});
  const at::Tensor strided = base.t().narrow(0, 3, 20);  // non-contiguous view
  ASSERT_FALSE(strided.is_contiguous());
  const std::vector<at::Tensor> grads = {at::Tensor(), strided, at::Tensor()};
  const double expected = reference_norm({strided});
  EXPECT_NEAR(global_grad_norm(grads), expected, kRelTol * expected);
  EXPECT_EQ(global_grad_norm({}), 0.0);
}

TEST(GradClipTest, ClipsWithTorchCoefficient) {
  // Norm of {3, 4} and {12} is sqrt(9 + 16 + 144) = 13, exact in float and double.
  at::Tensor a = at::tensor({3.0f, 4.0f});
  at::Tensor b = at::tensor({12.0f});
  const double norm = clip_grad_norm({a, b}, 1.0);
  EXPECT_DOUBLE_EQ(norm, 13.0);  // pre-clip norm returned
  const double coefficient = 1.0 / (13.0 + 1e-6);
  // mul_ by a scalar rounds the coefficient to float32 first; 4 ulp (FLOAT_EQ) covers it.
  EXPECT_FLOAT_EQ(a[0].item<float>(), static_cast<float>(3.0 * coefficient));
  EXPECT_FLOAT_EQ(a[1].item<float>(), static_cast<float>(4.0 * coefficient));
  EXPECT_FLOAT_EQ(b[0].item<float>(), static_cast<float>(12.0 * coefficient));
  EXPECT_NEAR(global_grad_norm({a, b}), 13.0 * coefficient, 1e-6);
}

TEST(GradClipTest, ClipsLowPrecisionGradsInPlaceKeepingDtype) {
  at::manual_seed(2);
  at::Tensor g = at::randn({1000}).to(at::kBFloat16);
  const at::Tensor before = g.clone();
  const double norm = clip_grad_norm({g}, 0.5);
  EXPECT_EQ(g.scalar_type(), at::kBFloat16);
  const at::Tensor expected = (before.to(at::kDouble) * (0.5 / (norm + 1e-6))).to(at::kBFloat16);
  // Both sides are one bf16 rounding of the same product: equal up to one bf16 ulp (2^-8).
  EXPECT_TRUE(at::allclose(g.to(at::kFloat), expected.to(at::kFloat), 1.0 / 128, 0.0));
  EXPECT_NEAR(global_grad_norm({g}), 0.5, 0.5 * 1e-2);  // bf16 rounding of every element
}

TEST(GradClipTest, NoClipWhenNormBelowMax) {
  at::Tensor a = at::tensor({3.0f, 4.0f});
  EXPECT_DOUBLE_EQ(clip_grad_norm({a}, 5.0 + 1e-3), 5.0);
  EXPECT_EQ(a[0].item<float>(), 3.0f);
  EXPECT_EQ(a[1].item<float>(), 4.0f);
  // Exactly at max_norm the coefficient 5 / (5 + 1e-6) is < 1: torch scales (barely) too.
  at::Tensor c = at::tensor({3.0, 4.0}, at::kDouble);
  clip_grad_norm({c}, 5.0);
  EXPECT_DOUBLE_EQ(c[1].item<double>(), 4.0 * (5.0 / (5.0 + 1e-6)));
}

TEST(GradClipTest, NonPositiveMaxNormOnlyMeasures) {
  for (double max_norm : {0.0, -1.0}) {
    at::Tensor a = at::tensor({30.0f, 40.0f});
    EXPECT_DOUBLE_EQ(clip_grad_norm({a}, max_norm), 50.0);
    EXPECT_EQ(a[1].item<float>(), 40.0f);
  }
}

TEST(GradClipTest, NonFiniteNormReturnedAndGradsUntouched) {
  at::Tensor a = at::tensor({1.0f, std::numeric_limits<float>::infinity()});
  at::Tensor b = at::tensor({2.0f});
  EXPECT_TRUE(std::isinf(clip_grad_norm({a, b}, 1.0)));
  EXPECT_EQ(b[0].item<float>(), 2.0f);
  at::Tensor c = at::tensor({std::numeric_limits<float>::quiet_NaN(), 5.0f});
  EXPECT_TRUE(std::isnan(clip_grad_norm({c}, 1.0)));
  EXPECT_EQ(c[1].item<float>(), 5.0f);
}

}  // namespace
}  // namespace mixtrain
