// reduce_dim0_shard_grad: this rank's rows of the mean over the data-parallel ranks, float32.
// One process (one-rank groups: a float32 copy, nothing divided), and 2 real processes with
// dp_shard 2 (reduce-scatter, uneven rows: 5 over 2 ranks is 3 + 2) and with dp_replicate 2
// (all-reduce). Each rank draws both ranks' gradients from fixed seeds, so it computes the
// expected mean alone: (g0 + g1) / 2 in float32 is exact to compare bitwise, since a sum of two
// float32 terms does not depend on the order and halving is exact. The blocked reduce-scatter
// (a block_bytes smaller than the wire form) must give the same bits: 11 rows over 2 ranks
// (chunks of 6, one padding row) in blocks of 1, 2 and 4 rows (the last block short), against
// the one-call path and the mean.
#include "mixtrain/distributed/dim0_shard_grad.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
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

at::Tensor tall_grad(int rank) {
  at::manual_seed(200 + rank);
  return at::randn({11, 3}).to(at::kBFloat16);
}

MIXTRAIN_WORKER(dim0_shard_grad_blocks) {
  DeviceMesh mesh = worker.make_mesh();
  const ShardLayout layout = chunk_layout({11, 3}, 2, mesh.rank);
  const at::Tensor mean = ((tall_grad(0).to(at::kFloat) + tall_grad(1).to(at::kFloat)) / 2)
                              .narrow(0, layout.offset, layout.rows);
  const at::Tensor whole = reduce_dim0_shard_grad(tall_grad(mesh.rank), layout,
                                                  *mesh.dp_shard_group, *mesh.dp_replicate_group);
  EXPECT_TRUE(at::equal(whole, mean)) << "rank " << mesh.rank;
  // One row on the wire is 2 ranks x 3 float32 = 24 bytes.
  for (const int64_t block_bytes : {int64_t{1}, int64_t{24}, int64_t{48}, int64_t{100}}) {
    const int64_t calls_before = thread_collective_stats()[CollectiveOp::kReduceScatter].calls;
    const at::Tensor blocked = reduce_dim0_shard_grad(
        tall_grad(mesh.rank), layout, *mesh.dp_shard_group, *mesh.dp_replicate_group, block_bytes);
    const int64_t calls =
        thread_collective_stats()[CollectiveOp::kReduceScatter].calls - calls_before;
    const int64_t block_rows = std::max<int64_t>(1, block_bytes / 24);
    EXPECT_EQ(calls, (6 + block_rows - 1) / block_rows) << "block_bytes " << block_bytes;
    ASSERT_EQ(blocked.sizes(), whole.sizes());
    EXPECT_TRUE(blocked.is_contiguous());
    EXPECT_TRUE(at::equal(blocked, whole))
        << "rank " << mesh.rank << ", block_bytes " << block_bytes;
  }
}

TEST(Dim0ShardGrad, BlockedReduceScatterGivesTheSameBits) {
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  const WorkerResult result = run_workers("dim0_shard_grad_blocks", 2, parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
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
