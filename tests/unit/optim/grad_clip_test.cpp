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
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/collectives.h"
#include "mixtrain/core/param_placement.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "support/test_sgd.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

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

// ChainedOptimizer::clip_grad_norm reads each parameter's placement (grad_clip.h, placed
// form): one process, one parameter per kind a single rank can hold (kWhole; kReplicated over a
// one-rank group; kDim0Shard whose one-rank shard group holds all rows), plus one without a
// grad. The norm must be that of every grad counted once, summed here in double; tolerance
// kRelTol (the kernel's float32 lanes, top of this file). The grads are then scaled by torch's
// coefficient for the returned norm: mul_ rounds it to float32 first, so 4 ulp (FLOAT_EQ).
TEST(GradClipTest, ChainedOptimizerClipsOverPlacements) {
  at::manual_seed(23);
  auto make_param = [](std::vector<int64_t> shape) {
    return at::zeros(shape).requires_grad_(true);
  };
  const at::Tensor whole = make_param({7, 5});
  const at::Tensor replicated = make_param({33});
  const at::Tensor shard = make_param({6, 4});
  const at::Tensor no_grad = make_param({3});
  ChainedOptimizer chain;
  chain.add_leaf(
      test_doubles::make_sgd({whole, replicated, shard, no_grad}, 0.1),
      {{"whole", whole}, {"replicated", replicated}, {"shard", shard}, {"no_grad", no_grad}});

  const std::shared_ptr<Collectives> shard_group = make_local_collectives("dp_shard");
  const std::shared_ptr<Collectives> replicate_group = make_local_collectives("dp_replicate");
  ParamPlacement rep = whole_placement("replicated", {33});
  rep.kind = ParamPlacement::Kind::kReplicated;
  rep.replicate_group = replicate_group;
  ParamPlacement dim0 = whole_placement("shard", {6, 4});
  dim0.kind = ParamPlacement::Kind::kDim0Shard;
  dim0.shard_group = shard_group;
  dim0.replicate_group = replicate_group;
  // "whole" and "no_grad" keep the kWhole placement every parameter starts with.
  chain.set_placements({rep, dim0});

  whole.mutable_grad() = at::randn({7, 5});
  replicated.mutable_grad() = at::randn({33}) * 3;
  shard.mutable_grad() = at::randn({6, 4}) * 0.5;
  const std::vector<at::Tensor> before = {whole.grad().clone(), replicated.grad().clone(),
                                          shard.grad().clone()};
  const double expected = reference_norm(before);
  const double max_norm = 0.25 * expected;  // clips: coefficient ~0.25

  const double norm = chain.clip_grad_norm(max_norm);
  EXPECT_NEAR(norm, expected, kRelTol * expected);
  const float coefficient = static_cast<float>(max_norm / (norm + 1e-6));
  const std::vector<at::Tensor> after = {whole.grad(), replicated.grad(), shard.grad()};
  for (size_t t = 0; t < after.size(); ++t) {
    const at::Tensor b = before[t].reshape({-1});
    const at::Tensor a = after[t].reshape({-1});
    for (int64_t i = 0; i < a.numel(); ++i) {
      EXPECT_FLOAT_EQ(a[i].item<float>(), b[i].item<float>() * coefficient)
          << "grad " << t << " element " << i;
    }
  }
  EXPECT_FALSE(no_grad.grad().defined());
}

// On CPU grads the unread form is the host form (no device to stay on): its norm as a float64
// CPU scalar, the grads clipped alike.
TEST(GradClipTest, UnreadFormOnTheCpuIsTheHostForm) {
  at::manual_seed(29);
  const std::vector<at::Tensor> grads = {at::randn({7, 5}), at::randn({33}).to(at::kBFloat16)};
  std::vector<at::Tensor> host = {grads[0].clone(), grads[1].clone()};
  const ParamPlacement a = whole_placement("a", {7, 5}), b = whole_placement("b", {33});
  const std::vector<const ParamPlacement*> placements = {&a, &b};
  const double max_norm = 0.5 * reference_norm(grads);
  const double want = clip_grad_norm(host, placements, max_norm);
  const at::Tensor got = clip_grad_norm_unread(grads, placements, max_norm);
  EXPECT_TRUE(got.device().is_cpu());
  EXPECT_EQ(got.scalar_type(), at::kDouble);
  EXPECT_EQ(got.item<double>(), want);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(grads[i].equal(host[i])) << i;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
