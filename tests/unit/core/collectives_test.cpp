// Communication counters (core/collectives.h) on the one-rank LocalCollectives: every call is
// counted with 0 bytes, per op kind (a max all-reduce as an all_reduce); process, thread and
// shared (per group set) counters; snapshots subtract; reset; concurrent threads lose no count.
// Byte counts of real groups: distributed/gloo_collectives_test.
#include "mixtrain/core/collectives.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

const CollectiveOp kOps[] = {CollectiveOp::kAllReduce,     CollectiveOp::kAllGather,
                             CollectiveOp::kReduceScatter, CollectiveOp::kAllToAll,
                             CollectiveOp::kBroadcast,     CollectiveOp::kBarrier};

// One call of every op kind.
void call_every_op(Collectives& group) {
  at::Tensor t = at::ones({4, 3});
  group.all_reduce_sum(t);
  group.all_gather(t);
  group.reduce_scatter_sum(t);
  group.all_to_all(t, {4}, {4});
  group.broadcast(t, 0);
  group.barrier();
}

TEST(CollectiveStatsTest, OpNames) {
  EXPECT_STREQ(collective_op_name(CollectiveOp::kAllReduce), "all_reduce");
  EXPECT_STREQ(collective_op_name(CollectiveOp::kAllGather), "all_gather");
  EXPECT_STREQ(collective_op_name(CollectiveOp::kReduceScatter), "reduce_scatter");
  EXPECT_STREQ(collective_op_name(CollectiveOp::kAllToAll), "all_to_all");
  EXPECT_STREQ(collective_op_name(CollectiveOp::kBroadcast), "broadcast");
  EXPECT_STREQ(collective_op_name(CollectiveOp::kBarrier), "barrier");
}

TEST(CollectiveStatsTest, LocalCollectivesCountCallsWithZeroBytes) {
  reset_collective_stats();
  auto group = make_local_collectives();
  call_every_op(*group);
  call_every_op(*group);
  at::Tensor t = at::zeros({2});
  group->all_reduce_sum(t);
  for (const CollectiveStats& stats : {collective_stats(), thread_collective_stats()}) {
    for (CollectiveOp op : kOps) {
      SCOPED_TRACE(collective_op_name(op));
      EXPECT_EQ(stats[op].calls, op == CollectiveOp::kAllReduce ? 3 : 2);
      EXPECT_EQ(stats[op].bytes, 0);
      EXPECT_GE(stats[op].seconds, 0.0);
    }
    EXPECT_EQ(stats.total().calls, 13);
    EXPECT_EQ(stats.total().bytes, 0);
  }
}

// The max all-reduce on one rank leaves the tensor as it was and counts as an all_reduce.
TEST(CollectiveStatsTest, LocalMaxAllReduceIsIdentityCountedAsAllReduce) {
  reset_collective_stats();
  auto group = make_local_collectives();
  at::Tensor t = at::tensor({-3.5f, 0.25f, -0.0f, 7.0f});
  const at::Tensor before = t.clone();
  group->all_reduce(t, ReduceOp::kMax);
  EXPECT_EQ(std::memcmp(t.data_ptr(), before.data_ptr(), t.nbytes()), 0);
  group->all_reduce_sum(t);
  const CollectiveStats stats = thread_collective_stats();
  EXPECT_EQ(stats[CollectiveOp::kAllReduce].calls, 2);
  EXPECT_EQ(stats.total().calls, 2);
  EXPECT_EQ(stats.total().bytes, 0);
}

TEST(CollectiveStatsTest, ArgumentErrorsAreNotCounted) {
  reset_collective_stats();
  auto group = make_local_collectives();
  at::Tensor t = at::ones({3});
  EXPECT_THROW(group->all_to_all(t, {2}, {2}), std::invalid_argument);
  EXPECT_THROW(group->broadcast(t, 1), std::invalid_argument);
  EXPECT_EQ(collective_stats().total().calls, 0);
}

TEST(CollectiveStatsTest, SnapshotsSubtractAndResetZeroes) {
  reset_collective_stats();
  auto group = make_local_collectives();
  group->barrier();
  const CollectiveStats before = collective_stats();
  call_every_op(*group);
  const CollectiveStats span = collective_stats() - before;
  for (CollectiveOp op : kOps) EXPECT_EQ(span[op].calls, 1) << collective_op_name(op);
  EXPECT_EQ(collective_stats()[CollectiveOp::kBarrier].calls, 2);

  record_collective(CollectiveOp::kAllGather, 1000, 0.25);
  EXPECT_EQ(collective_stats()[CollectiveOp::kAllGather].bytes, 1000);
  EXPECT_DOUBLE_EQ((collective_stats() - before)[CollectiveOp::kAllGather].seconds -
                       span[CollectiveOp::kAllGather].seconds,
                   0.25);

  reset_collective_stats();
  for (const CollectiveStats& stats : {collective_stats(), thread_collective_stats()}) {
    EXPECT_EQ(stats.total().calls, 0);
    EXPECT_EQ(stats.total().bytes, 0);
    EXPECT_EQ(stats.total().seconds, 0.0);
  }
}

// Threads (the async checkpoint thread, the training loop) count into the process total
// without losing updates; each thread's own counters see only its calls.
TEST(CollectiveStatsTest, ThreadsCountSeparatelyAndLoseNothing) {
  reset_collective_stats();
  constexpr int kThreads = 4, kCalls = 500;
  std::vector<int64_t> own_calls(kThreads, -1);
  std::vector<int64_t> own_bytes(kThreads, -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([i, &own_calls, &own_bytes] {
      auto group = make_local_collectives("thread" + std::to_string(i));
      for (int k = 0; k < kCalls; ++k) {
        group->barrier();
        record_collective(CollectiveOp::kAllToAll, i + 1, 0.0);
      }
      own_calls[i] = thread_collective_stats().total().calls;
      own_bytes[i] = thread_collective_stats()[CollectiveOp::kAllToAll].bytes;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(own_calls[i], 2 * kCalls);
    EXPECT_EQ(own_bytes[i], (i + 1) * kCalls);
  }
  const CollectiveStats all = collective_stats();
  EXPECT_EQ(all[CollectiveOp::kBarrier].calls, kThreads * kCalls);
  EXPECT_EQ(all[CollectiveOp::kAllToAll].calls, kThreads * kCalls);
  EXPECT_EQ(all[CollectiveOp::kAllToAll].bytes, (1 + 2 + 3 + 4) * kCalls);
  EXPECT_EQ(thread_collective_stats().total().calls, 0);  // this thread made none
}

// A set of groups sharing CollectiveCounters counts their calls whichever thread makes them
// (on CUDA autograd runs backward, and the gradient reduction in it, on a device worker
// thread): the calling thread's own counters miss the worker's calls, the shared set does not.
TEST(CollectiveStatsTest, SharedCountersSeeEveryThreadsCalls) {
  auto counters = std::make_shared<CollectiveCounters>();
  auto shard = make_local_collectives("dp_shard");
  auto expert = make_local_collectives("ep");
  auto other = make_local_collectives("background");
  shard->count_into(counters);
  expert->count_into(counters);
  const CollectiveStats thread_before = thread_collective_stats();
  shard->barrier();  // this thread
  std::thread worker([&] {
    at::Tensor t = at::ones({4, 3});
    for (int k = 0; k < 3; ++k) shard->reduce_scatter_sum(t);
    expert->all_to_all(t, {4}, {4});
    other->barrier();  // not in the set
  });
  worker.join();
  const CollectiveStats seen = counters->snapshot();
  EXPECT_EQ(seen[CollectiveOp::kBarrier].calls, 1);
  EXPECT_EQ(seen[CollectiveOp::kReduceScatter].calls, 3);
  EXPECT_EQ(seen[CollectiveOp::kAllToAll].calls, 1);
  EXPECT_EQ(seen.total().calls, 5);
  // This thread's counters saw only its own barrier.
  EXPECT_EQ((thread_collective_stats() - thread_before).total().calls, 1);
  EXPECT_EQ(other->counters(), nullptr);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
