// ExpertSliceGrads on one rank (a one-rank expert_dp group; the 2-rank exchange is covered
// end to end by expert_parallel_test against a single-process reference): contributions sum in
// float32, a parameter without any is zeros, the mean divides by the data-parallel ranks, and a
// reduced gradient is forgotten. Expectations are exact: float32 sums of bf16 values and a
// division by a power of two.
#include "mixtrain/distributed/expert_slice_grad.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(ExpertSliceGrads, SumsContributionsAndDividesByTheRanks) {
  auto expert_dp = make_local_collectives("expert_dp");
  at::manual_seed(3);
  const at::Tensor a = at::randn({2, 3, 4}).to(at::kBFloat16);
  const at::Tensor b = at::randn({2, 3, 4}).to(at::kBFloat16);
  ExpertSliceGrads grads;
  grads.add(7, a);
  grads.add(7, b);
  const at::Tensor reduced = grads.reduce(7, a.sizes(), at::kCPU, *expert_dp, 4.0);
  EXPECT_EQ(reduced.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(reduced, (a.to(at::kFloat) + b.to(at::kFloat)) / 4));
  // Forgotten once reduced: the next backward starts from nothing.
  EXPECT_TRUE(
      at::equal(grads.reduce(7, a.sizes(), at::kCPU, *expert_dp, 4.0), at::zeros({2, 3, 4})));
}

TEST(ExpertSliceGrads, KeepsACopyOfTheFirstContribution) {
  auto expert_dp = make_local_collectives("expert_dp");
  const at::Tensor first = at::ones({2, 2});
  ExpertSliceGrads grads;
  grads.add(0, first);
  grads.add(0, first);
  EXPECT_TRUE(at::equal(first, at::ones({2, 2})));  // the input is not accumulated into
  EXPECT_TRUE(
      at::equal(grads.reduce(0, first.sizes(), at::kCPU, *expert_dp, 1.0), at::full({2, 2}, 2.0)));
}

TEST(ExpertSliceGrads, ClearDropsPendingGradients) {
  auto expert_dp = make_local_collectives("expert_dp");
  ExpertSliceGrads grads;
  grads.add(1, at::ones({3}));
  grads.clear();
  EXPECT_TRUE(at::equal(grads.reduce(1, {3}, at::kCPU, *expert_dp, 1.0), at::zeros({3})));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
