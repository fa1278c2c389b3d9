// ChainedOptimizer::any_piece_holder on 2 real processes (dp_shard 2): the float16 loss
// scaler's inf/nan flag of one rank's shard reaches the other rank, so both skip the step; a
// replicated parameter adds no group; a one-rank optimizer returns its own flag. With tp 2 x
// dp_shard 2 (4 processes), one rank's flag on a tp-split shard reaches all four ranks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "mixtrain/core/param_placement.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "support/multiprocess.h"
#include "support/placed_chain.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::run_workers;
using testing::WorkerResult;

MIXTRAIN_WORKER(found_inf_2_ranks) {
  DeviceMesh mesh = worker.make_mesh();
  const int rank = mesh.rank;
  const auto placed = testing::make_placed_chain(mesh);
  ChainedOptimizer& chain = placed->chain;
  // Only rank 1's rows overflowed: both ranks learn it; no rank: neither does.
  const bool first = chain.any_piece_holder(rank == 1);
  const bool second = chain.any_piece_holder(false);
  worker.write_text("flags_" + std::to_string(rank),
                    std::string(first ? "1" : "0") + (second ? "1" : "0"));
}

TEST(PlacedFoundInf, OneShardsOverflowIsEveryHoldersAndNoneIsNobodys) {
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  const WorkerResult result = run_workers("found_inf_2_ranks", 2, parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  EXPECT_EQ(result.read_text("flags_0"), "10");
  EXPECT_EQ(result.read_text("flags_1"), "10");
}

TEST(PlacedFoundInf, OneRankReturnsItsOwnFlag) {
  const at::Tensor p = at::zeros({3}).requires_grad_(true);
  ChainedOptimizer chain;
  chain.add_leaf(test_doubles::make_sgd({p}, 0.1), {{"p", p}});
  EXPECT_TRUE(chain.any_piece_holder(true));
  EXPECT_FALSE(chain.any_piece_holder(false));
}

MIXTRAIN_WORKER(found_inf_tp2_dp2) {
  DeviceMesh mesh = worker.make_mesh();
  const at::Tensor p = at::zeros({1, 6}).requires_grad_(true);
  ChainedOptimizer chain;
  chain.add_leaf(test_doubles::make_sgd({p}, 0.1), {{"w", p}});
  ParamPlacement placement = whole_placement("w", {4, 6});
  placement.kind = ParamPlacement::Kind::kDim0Shard;  // tp slice [2, 6], one row per shard
  placement.tp_dim = 0;
  placement.tp_group = mesh.tp_group;
  placement.shard_group = mesh.dp_shard_group;
  placement.replicate_group = mesh.dp_replicate_group;
  placement.offset = mesh.shard_index();
  placement.rows = 1;
  chain.set_placements({placement});
  // Only the last rank (shard 1, tp 1) overflowed: shard 0 x tp 0 shares no group with it.
  const bool first = chain.any_piece_holder(mesh.rank == 3);
  const bool second = chain.any_piece_holder(false);
  worker.write_text("flags_" + std::to_string(mesh.rank),
                    std::string(first ? "1" : "0") + (second ? "1" : "0"));
}

TEST(PlacedFoundInf, TensorParallelShardsOverflowReachesEveryRank) {
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  parallel.tp = 2;
  const WorkerResult result = run_workers("found_inf_tp2_dp2", 4, parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(result.read_text("flags_" + std::to_string(r)), "10");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
