// ChainedOptimizer::clip_grad_norm over placements on 2 real processes (dp_shard 2): a dim-0
// sharded parameter (each rank holds half the rows; the pieces' squares are all-reduced over
// dp_shard) and a replicated one (kReplicated over the world: each rank holds all of it, and
// it must count once, not once per rank). Both ranks draw the same full gradients from one
// seed and take their own rows, so each computes the expected norm alone, in double.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/param_placement.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "support/multiprocess.h"
#include "support/placed_chain.h"

namespace mixtrain {
namespace {

using testing::run_workers;
using testing::WorkerResult;

// Norm tolerance: 1e-5 relative, as grad_clip_test (the kernel's float32 lanes add at most 64
// squares before the double flush: ~4e-6 relative on the sum).
constexpr double kRelTol = 1e-5;

double sum_of_squares_in_double(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();  // exact for float32
  double sum = 0.0;
  for (int64_t i = 0; i < d.numel(); ++i) sum += d.data_ptr<double>()[i] * d.data_ptr<double>()[i];
  return sum;
}

MIXTRAIN_WORKER(placed_clip_2_ranks) {
  DeviceMesh mesh = worker.make_mesh();
  const int rank = mesh.rank;
  at::manual_seed(41);  // the same full gradients on both ranks
  const at::Tensor full_shard_grad = at::randn({4, 3});
  const at::Tensor replicated_grad = at::randn({5}) * 4;

  const auto placed = testing::make_placed_chain(mesh);
  const at::Tensor& shard = placed->shard;
  const at::Tensor& replicated = placed->replicated;
  ChainedOptimizer& chain = placed->chain;
  shard.mutable_grad() = full_shard_grad.narrow(0, 2 * rank, 2).clone();
  replicated.mutable_grad() = replicated_grad.clone();

  const double shard_sum = sum_of_squares_in_double(full_shard_grad);
  const double replicated_sum = sum_of_squares_in_double(replicated_grad);
  const double expected = std::sqrt(shard_sum + replicated_sum);
  // What counting the replicated grad once per rank would give: must be told apart.
  const double twice = std::sqrt(shard_sum + 2 * replicated_sum);
  ASSERT_GT(twice - expected, 100 * kRelTol * expected);

  const double norm = chain.clip_grad_norm(0.0);  // max_norm 0: measure only
  EXPECT_NEAR(norm, expected, kRelTol * expected) << "rank " << rank;
  char text[64];
  std::snprintf(text, sizeof(text), "%a", norm);
  worker.write_text("norm_" + std::to_string(rank), text);
}

TEST(PlacedGradClip, ShardsSumOverRanksAndReplicatedCountsOnce) {
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  const WorkerResult result = run_workers("placed_clip_2_ranks", 2, parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  // Every rank clips with the same coefficient: the norms are bitwise equal.
  EXPECT_EQ(result.read_text("norm_0"), result.read_text("norm_1"));
}

}  // namespace
}  // namespace mixtrain
