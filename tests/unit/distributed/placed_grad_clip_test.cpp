// ChainedOptimizer::clip_grad_norm over placements on 2 real processes (dp_shard 2): a dim-0
// sharded parameter (each rank holds half the rows; the pieces' squares are all-reduced over
// dp_shard) and a replicated one (kReplicated over the world: each rank holds all of it, and
// it must count once, not once per rank). Both ranks draw the same full gradients from one
// seed and take their own rows, so each computes the expected norm alone, in double.
// Tensor parallelism on 4 processes (tp 2 x dp_shard 2): a column-parallel (tp_dim 0) and a
// row-parallel (tp_dim 1) parameter, each tp slice dim-0 sharded over dp_shard (summed over
// dp_shard, then over tp), and a parameter whole on both tp ranks (tp_dim -1, dp_shard rows:
// counted once, not once per tp rank), vs the norm of the unsharded gradients.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/param_placement.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "support/multiprocess.h"
#include "support/placed_chain.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

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

// This rank's box of `full` under `placement` (global_offsets / local_sizes).
at::Tensor box_of(const at::Tensor& full, const ParamPlacement& placement) {
  at::Tensor box = full;
  const auto offsets = placement.global_offsets();
  const auto sizes = placement.local_sizes();
  for (size_t d = 0; d < sizes.size(); ++d) box = box.narrow(d, offsets[d], sizes[d]);
  return box.clone();
}

ParamPlacement tp_sharded(const DeviceMesh& mesh, const std::string& name,
                          const std::vector<int64_t>& shape, int64_t tp_dim) {
  ParamPlacement p = whole_placement(name, shape);
  p.kind = ParamPlacement::Kind::kDim0Shard;
  p.tp_dim = tp_dim;
  p.tp_group = mesh.tp_group;
  p.shard_group = mesh.dp_shard_group;
  p.replicate_group = mesh.dp_replicate_group;
  const int64_t rows = p.tp_shape()[0] / mesh.dp_shard;  // even split in this test
  p.offset = mesh.shard_index() * rows;
  p.rows = rows;
  return p;
}

MIXTRAIN_WORKER(placed_clip_tp2_dp2) {
  DeviceMesh mesh = worker.make_mesh();
  at::manual_seed(43);  // the same full gradients on every rank
  const std::vector<at::Tensor> full = {at::randn({4, 6}), at::randn({4, 6}), at::randn({6}) * 3};
  const std::vector<ParamPlacement> placements = {tp_sharded(mesh, "column", {4, 6}, 0),
                                                  tp_sharded(mesh, "row", {4, 6}, 1),
                                                  tp_sharded(mesh, "bias", {6}, -1)};
  std::vector<at::Tensor> params;
  NamedTensors named;
  for (size_t i = 0; i < full.size(); ++i) {
    params.push_back(at::zeros(placements[i].local_sizes()).requires_grad_(true));
    params.back().mutable_grad() = box_of(full[i], placements[i]);
    named.emplace_back(placements[i].name, params.back());
  }
  ChainedOptimizer chain;
  chain.add_leaf(test_doubles::make_sgd(params, 0.1), named);
  chain.set_placements(placements);

  const double tp_split_sum = sum_of_squares_in_double(full[0]) + sum_of_squares_in_double(full[1]);
  const double bias_sum = sum_of_squares_in_double(full[2]);
  const double expected = std::sqrt(tp_split_sum + bias_sum);
  // Counting the tp-whole bias once per tp rank, or a tp split's slice only: told apart.
  ASSERT_GT(std::sqrt(tp_split_sum + 2 * bias_sum) - expected, 100 * kRelTol * expected);
  const double norm = chain.clip_grad_norm(0.0);
  EXPECT_NEAR(norm, expected, kRelTol * expected) << "rank " << mesh.rank;
  char text[64];
  std::snprintf(text, sizeof(text), "%a", norm);
  worker.write_text("norm_" + std::to_string(mesh.rank), text);
}

TEST(PlacedGradClip, TensorParallelSlicesSumOverTpAndTpWholeCountsOnce) {
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  parallel.tp = 2;
  const WorkerResult result = run_workers("placed_clip_tp2_dp2", 4, parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(result.read_text("norm_" + std::to_string(r)), result.read_text("norm_0"));
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
