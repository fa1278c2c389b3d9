// reduce_dim0_shard_grad: this rank's rows of the mean over the data-parallel ranks, float32.
// One process (one-rank groups: a float32 copy, nothing divided), and 2 real processes with
// dp_shard 2 (reduce-scatter, uneven rows: 5 over 2 ranks is 3 + 2) and with dp_replicate 2
// (all-reduce). Each rank draws both ranks' gradients from fixed seeds, so it computes the
// expected mean alone: (g0 + g1) / 2 in float32 is exact to compare bitwise, since a sum of two
// float32 terms does not depend on the order and halving is exact.
#include "mixtrain/distributed/dim0_shard_grad.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "support/multiprocess.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::run_workers;
using testing::WorkerResult;

at::Tensor rank_grad(int rank) {
  at::manual_seed(100 + rank);
  return at::randn({5, 4}).to(at::kBFloat16);  // the compute dtype of a bf16 model
}

at::Tensor expected_mean() {
  return (rank_grad(0).to(at::kFloat) + rank_grad(1).to(at::kFloat)) / 2;
}

TEST(Dim0ShardGrad, OneRankIsAFloat32Copy) {
  auto shard = make_local_collectives("shard");
  auto replicate = make_local_collectives("replicate");
  const at::Tensor full = rank_grad(0);
  const at::Tensor grad =
      reduce_dim0_shard_grad(full, chunk_layout({5, 4}, 1, 0), *shard, *replicate);
  EXPECT_EQ(grad.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(grad, full.to(at::kFloat)));
  // A new tensor: adding into it later (main_grad accumulation) must not touch the input.
  const at::Tensor f32 = full.to(at::kFloat);
  const at::Tensor copy =
      reduce_dim0_shard_grad(f32, chunk_layout({5, 4}, 1, 0), *shard, *replicate);
  EXPECT_FALSE(copy.data_ptr() == f32.data_ptr());
}

MIXTRAIN_WORKER(dim0_shard_grad_sharded) {
  DeviceMesh mesh = worker.make_mesh();
  const ShardLayout layout = chunk_layout({5, 4}, 2, mesh.rank);
  const at::Tensor grad = reduce_dim0_shard_grad(rank_grad(mesh.rank), layout, *mesh.dp_shard_group,
                                                 *mesh.dp_replicate_group);
  ASSERT_EQ(grad.size(0), layout.rows);
  EXPECT_TRUE(at::equal(grad, expected_mean().narrow(0, layout.offset, layout.rows)))
      << "rank " << mesh.rank;
}

MIXTRAIN_WORKER(dim0_shard_grad_replicated) {
  DeviceMesh mesh = worker.make_mesh();
  const at::Tensor grad = reduce_dim0_shard_grad(rank_grad(mesh.rank), chunk_layout({5, 4}, 1, 0),
                                                 *mesh.dp_shard_group, *mesh.dp_replicate_group);
  EXPECT_TRUE(at::equal(grad, expected_mean())) << "rank " << mesh.rank;
}

TEST(Dim0ShardGrad, TwoShardsGetTheirRowsOfTheMean) {
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  const WorkerResult result = run_workers("dim0_shard_grad_sharded", 2, parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
}

TEST(Dim0ShardGrad, TwoReplicasGetTheWholeMean) {
  ParallelConfig parallel;
  parallel.dp_replicate = 2;
  const WorkerResult result = run_workers("dim0_shard_grad_replicated", 2, parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
