// GlooCollectives on 2 and 4 real processes: every op for float32, bfloat16 (bitwise: Gloo
// moves its bytes), float16 and int64, uneven all_to_all splits (with empty ones) and
// reduce_scatter_sum against the sum written out by hand. Expected values are closed-form
// functions of (sender, receiver, row, column), computed on each rank without communication.
// all_reduce with ReduceOp::kMax (float32 with negatives, float64, int64) bitwise against the
// max taken in the test. Also the communication counters: calls, seconds and the bytes each
// rank sends, per op; and the async all_to_all / all_gather, several in flight at once, waited
// in another order.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "mixtrain/core/error.h"
#include "mixtrain/distributed/gloo_collectives.h"
#include "support/multiprocess.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::run_workers;
using testing::WorkerResult;

const at::ScalarType kTypes[] = {at::kFloat, at::kBFloat16, at::kHalf, at::kLong};

// Small integers: exact in every dtype above (bfloat16 holds integers up to 256 exactly).
double value(int sender, int receiver, int64_t row, int64_t column) {
  return sender * 64 + receiver * 16 + row * 2 + column;
}

// Rows of `count` x 2 filled with value(sender, receiver, row, column).
at::Tensor block(int sender, int receiver, int64_t count, at::ScalarType type) {
  at::Tensor t = at::empty({count, 2}, at::kDouble);
  for (int64_t k = 0; k < count; ++k) {
    for (int64_t j = 0; j < 2; ++j) t[k][j] = value(sender, receiver, k, j);
  }
  return t.to(type);
}

// Uneven split with zeros: sender s gives receiver d this many rows.
int64_t count(int sender, int receiver) {
  return (sender + 2 * receiver) % 3;
}

// bfloat16 bit patterns a float round trip would change: signalling-NaN payloads, -0,
// subnormals, +-inf. Gloo must move them untouched.
at::Tensor bf16_bits(int rank) {
  const int16_t bits[] = {
      0x7F81, static_cast<int16_t>(0xFFC1), static_cast<int16_t>(0x8000), 0x0001,
      0x7F80, static_cast<int16_t>(0xFF80)};
  at::Tensor t = at::empty({6}, at::kShort);
  for (int i = 0; i < 6; ++i) t[i] = static_cast<int16_t>(bits[i] ^ rank);
  return t.view(at::kBFloat16);
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// Rank `sender`'s input to the max all-reduce: element 0 negative on every rank (the max is
// rank 0's -1.5), the others 100 sin(1.3 s + 0.7 i), so the winning rank varies by element
// and many are negative; no NaN. Every rank computes every rank's row alike (same code).
at::Tensor max_input(int sender, at::ScalarType type) {
  at::Tensor t = at::empty({9}, at::kDouble);
  t[0] = -1.5 - 0.25 * sender;
  for (int64_t i = 1; i < 9; ++i) t[i] = 100.0 * std::sin(1.3 * sender + 0.7 * i);
  return t.to(type);  // int64 truncates toward zero: still signed, rank-dependent
}

MIXTRAIN_WORKER(all_ops) {
  DeviceMesh mesh = worker.make_mesh();
  Collectives& world = *mesh.world;
  const int rank = world.rank();
  const int n = world.size();
  EXPECT_EQ(rank, worker.rank.rank);
  EXPECT_EQ(n, worker.rank.world_size);
  EXPECT_EQ(world.name(), "world");

  for (at::ScalarType type : kTypes) {
    SCOPED_TRACE(c10::toString(type));
    // all_gather: rank order along dim 0.
    at::Tensor gathered = world.all_gather(block(rank, 0, 3, type));
    at::Tensor expected = at::cat([&] {
      std::vector<at::Tensor> parts;
      for (int s = 0; s < n; ++s) parts.push_back(block(s, 0, 3, type));
      return parts;
    }());
    EXPECT_TRUE(same_bits(gathered, expected)) << gathered;

    // all_to_all, uneven splits (some empty).
    std::vector<int64_t> send(n), recv(n);
    std::vector<at::Tensor> outgoing, incoming;
    for (int d = 0; d < n; ++d) {
      send[d] = count(rank, d);
      recv[d] = count(d, rank);
      outgoing.push_back(block(rank, d, send[d], type));
      incoming.push_back(block(d, rank, recv[d], type));
    }
    at::Tensor received = world.all_to_all(at::cat(outgoing), send, recv);
    EXPECT_TRUE(same_bits(received, at::cat(incoming))) << received;

    // The async forms: three started before any is waited for, waited in reverse order (the
    // order of starting is what must match across ranks), giving the blocking results; the
    // second all_to_all sends the mirrored split.
    auto first = world.all_to_all_async(at::cat(outgoing), send, recv);
    auto second = world.all_to_all_async(at::cat(incoming), recv, send);
    auto third = world.all_gather_async(block(rank, 0, 3, type));
    EXPECT_TRUE(same_bits(third->wait(), expected));
    EXPECT_TRUE(same_bits(second->wait(), at::cat(outgoing)));
    EXPECT_TRUE(same_bits(first->wait(), at::cat(incoming)));
    EXPECT_THROW(first->wait(), std::logic_error);

    // broadcast from the last rank.
    at::Tensor payload = rank == n - 1 ? block(7, 3, 2, type) : at::zeros({2, 2}, type);
    world.broadcast(payload, n - 1);
    EXPECT_TRUE(same_bits(payload, block(7, 3, 2, type)));

    if (type == at::kBFloat16) {
      // Reductions of bfloat16 are refused (a bfloat16 sum rounds every partial sum).
      at::Tensor t = at::ones({2}, type);
      EXPECT_THROW(world.all_reduce_sum(t), std::invalid_argument);
      EXPECT_THROW(world.all_reduce(t, ReduceOp::kMax), std::invalid_argument);
      EXPECT_THROW(world.reduce_scatter_sum(at::ones({2 * n}, type)), std::invalid_argument);
      continue;
    }
    // all_reduce_sum: sum over s of value(s, 1, k, j).
    at::Tensor summed = block(rank, 1, 2, type);
    world.all_reduce_sum(summed);
    at::Tensor hand = at::zeros({2, 2}, at::kDouble);
    for (int s = 0; s < n; ++s) hand += block(s, 1, 2, at::kDouble);
    EXPECT_TRUE(same_bits(summed, hand.to(type))) << summed;

    // reduce_scatter_sum: chunk `rank` (2 rows) of every rank's full [2n, 2] tensor, summed.
    // Row k of rank s's full tensor holds value(s, 2, k, j).
    at::Tensor scattered = world.reduce_scatter_sum(block(rank, 2, 2 * n, type));
    at::Tensor by_hand = at::zeros({2, 2}, at::kDouble);
    for (int s = 0; s < n; ++s) {
      for (int64_t k = 0; k < 2; ++k) {
        for (int64_t j = 0; j < 2; ++j) by_hand[k][j] += value(s, 2, rank * 2 + k, j);
      }
    }
    EXPECT_TRUE(same_bits(scattered, by_hand.to(type))) << scattered;
  }

  // all_reduce max: every rank ends with the elementwise max of all ranks' inputs, bit for bit
  // (max rounds nothing); counted as one all_reduce with the ring's 2 (n-1)/n bytes.
  for (at::ScalarType type : {at::kFloat, at::kDouble, at::kLong}) {
    SCOPED_TRACE(c10::toString(type));
    at::Tensor expected_max = max_input(0, type);
    for (int s = 1; s < n; ++s) expected_max = at::maximum(expected_max, max_input(s, type));
    at::Tensor maxed = max_input(rank, type);
    const CollectiveStats before = thread_collective_stats();
    world.all_reduce(maxed, ReduceOp::kMax);
    const CollectiveOpStats counted =
        (thread_collective_stats() - before)[CollectiveOp::kAllReduce];
    EXPECT_TRUE(same_bits(maxed, expected_max)) << maxed << expected_max;
    EXPECT_EQ(counted.calls, 1);
    EXPECT_EQ(counted.bytes, 2 * (n - 1) * static_cast<int64_t>(maxed.nbytes()) / n);
  }
  const at::Tensor max_of_two = at::maximum(max_input(0, at::kFloat), max_input(1, at::kFloat));
  EXPECT_EQ(max_of_two[0].item<float>(), -1.5f);                  // the all-negative element
  EXPECT_FALSE(at::equal(max_of_two, max_input(0, at::kFloat)));  // rank 1 wins somewhere
  EXPECT_FALSE(at::equal(max_of_two, max_input(1, at::kFloat)));  // and rank 0 somewhere

  // bfloat16 bit patterns through every data-movement op.
  at::Tensor bits = world.all_gather(bf16_bits(rank));
  for (int s = 0; s < n; ++s) EXPECT_TRUE(same_bits(bits.narrow(0, 6 * s, 6), bf16_bits(s)));
  std::vector<int64_t> ones(n, 6);
  at::Tensor outgoing = at::cat(std::vector<at::Tensor>(n, bf16_bits(rank)));
  at::Tensor exchanged = world.all_to_all(outgoing, ones, ones);
  for (int s = 0; s < n; ++s) {
    EXPECT_TRUE(same_bits(exchanged.narrow(0, 6 * s, 6), bf16_bits(s)));
  }
  at::Tensor sent = rank == 0 ? bf16_bits(0) : at::zeros({6}, at::kBFloat16);
  world.broadcast(sent, 0);
  EXPECT_TRUE(same_bits(sent, bf16_bits(0)));

  // float32 reduce-scatter sums in rank order: (((a0 + a1) + a2) + a3), bit for bit.
  at::Tensor odd = at::full({n, 1}, 0.1f * static_cast<float>(rank + 1));
  at::Tensor sum = world.reduce_scatter_sum(odd);
  float order = 0.1f;
  for (int s = 1; s < n; ++s) order += 0.1f * static_cast<float>(s + 1);
  EXPECT_EQ(sum.item<float>(), order);

  // Misuse is a programming error, caught before any communication.
  EXPECT_THROW(
      world.all_to_all(at::zeros({3, 2}), std::vector<int64_t>(n, 1), std::vector<int64_t>(n, 1)),
      std::invalid_argument);
  EXPECT_THROW(world.reduce_scatter_sum(at::zeros({2 * n + 1})), std::invalid_argument);
  at::Tensor shorts = at::zeros({2}, at::kShort);
  EXPECT_THROW(world.all_reduce_sum(shorts), std::invalid_argument);
  world.barrier();
  worker.write_text("done" + std::to_string(rank), "ok");
}

// Communication counters: one call of each op with known sizes, bytes against the values of
// core/collectives.h's table worked out by hand for 2 and 4 ranks.
MIXTRAIN_WORKER(counters) {
  DeviceMesh mesh = worker.make_mesh();
  Collectives& world = *mesh.world;
  const int rank = world.rank();
  const int n = world.size();
  ASSERT_TRUE(n == 2 || n == 4);
  const bool two = n == 2;
  reset_collective_stats();  // joining the mesh made calls of its own

  // all_reduce: float32 [6, 4] = 96 bytes; ring: 2 (n-1)/n x 96 = 96 (n=2), 144 (n=4).
  at::Tensor reduced = at::ones({6, 4});
  world.all_reduce_sum(reduced);
  // all_gather: bfloat16 [3, 2] = 12 bytes reach n-1 peers: 12 (n=2), 36 (n=4).
  world.all_gather(block(rank, 0, 3, at::kBFloat16));
  // reduce_scatter: float32 [2n, 2] = 16n bytes, the n-1 peers' chunks of 16: 16, 48.
  world.reduce_scatter_sum(block(rank, 2, 2 * n, at::kFloat));
  // all_to_all: int64 rows of 2 (16 bytes), count(rank, d) rows to each d != rank:
  //   n=2: rank 0 sends 2 rows, rank 1 sends 1 -> 32, 16;
  //   n=4: ranks send 2+1+0, 1+2+1, 2+1+2, 0+2+1 rows -> 48, 64, 80, 48.
  std::vector<int64_t> send(n), recv(n);
  std::vector<at::Tensor> outgoing;
  for (int d = 0; d < n; ++d) {
    send[d] = count(rank, d);
    recv[d] = count(d, rank);
    outgoing.push_back(block(rank, d, send[d], at::kLong));
  }
  world.all_to_all(at::cat(outgoing), send, recv);
  // broadcast: float16 [5] = 10 bytes from the last rank to n-1 peers: 10, 30 on the root.
  at::Tensor payload = at::zeros({5}, at::kHalf);
  world.broadcast(payload, n - 1);
  world.barrier();

  const int64_t all_to_all_bytes[2][4] = {{32, 16, 0, 0}, {48, 64, 80, 48}};
  const CollectiveStats stats = thread_collective_stats();
  EXPECT_EQ(stats[CollectiveOp::kAllReduce].bytes, two ? 96 : 144);
  EXPECT_EQ(stats[CollectiveOp::kAllGather].bytes, two ? 12 : 36);
  EXPECT_EQ(stats[CollectiveOp::kReduceScatter].bytes, two ? 16 : 48);
  EXPECT_EQ(stats[CollectiveOp::kAllToAll].bytes, all_to_all_bytes[two ? 0 : 1][rank]);
  EXPECT_EQ(stats[CollectiveOp::kBroadcast].bytes, rank == n - 1 ? (two ? 10 : 30) : 0);
  EXPECT_EQ(stats[CollectiveOp::kBarrier].bytes, 0);
  for (size_t i = 0; i < kCollectiveOpCount; ++i) {
    SCOPED_TRACE(collective_op_name(static_cast<CollectiveOp>(i)));
    EXPECT_EQ(stats.ops[i].calls, 1);
    EXPECT_GT(stats.ops[i].seconds, 0.0);
    // One thread: the process counters saw the same calls.
    EXPECT_EQ(collective_stats().ops[i].calls, 1);
    EXPECT_EQ(collective_stats().ops[i].bytes, stats.ops[i].bytes);
  }
  // Argument errors are caught before any communication and are not counted.
  EXPECT_THROW(world.reduce_scatter_sum(at::zeros({2 * n + 1})), std::invalid_argument);
  EXPECT_EQ(thread_collective_stats()[CollectiveOp::kReduceScatter].calls, 1);
  worker.write_text("counted" + std::to_string(rank), "ok");
}

// reduce_scatter_sum adds in rank order on every rank: r0 + r1 + r2 + r3, which is what the
// single-process reference computes. Values where float32 addition is not associative:
// ((1e8 + 1) - 1e8) + 1 = 1, while other orders give 0 or 2 (1e8 + 1 rounds to 1e8). Gloo's own
// _reduce_scatter_base (a ring all-reduce) gives 0 on ranks 0 and 1 of 4 (measured with
// LibTorch 2.11): the reason reduce_scatter_sum is alltoall plus a local sum.
MIXTRAIN_WORKER(rank_order) {
  DeviceMesh mesh = worker.make_mesh();
  Collectives& world = *mesh.world;
  const float mine[] = {1e8f, 1.0f, -1e8f, 1.0f};
  const int n = world.size();
  at::Tensor full = at::full({n}, mine[world.rank()], at::kFloat);
  const float got = world.reduce_scatter_sum(full).item<float>();
  float expected = mine[0];
  for (int r = 1; r < n; ++r) expected += mine[r];
  EXPECT_EQ(expected, 1.0f);  // the order-sensitive case really is order sensitive
  EXPECT_EQ(got, expected);
  worker.write_text("sum" + std::to_string(world.rank()), std::to_string(got));
}

TEST(GlooCollectivesTest, ReduceScatterSumsInRankOrderOnFourRanks) {
  ParallelConfig parallel;
  parallel.dp_shard = 4;
  const WorkerResult result = run_workers("rank_order", 4, parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(result.read_text("sum" + std::to_string(r)), "1.000000");
}

void run_counters(int nproc) {
  ParallelConfig parallel;
  parallel.dp_shard = nproc;
  const WorkerResult result = run_workers("counters", nproc, parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  for (int r = 0; r < nproc; ++r) EXPECT_EQ(result.read_text("counted" + std::to_string(r)), "ok");
}

TEST(GlooCollectivesTest, CountersOnTwoRanks) {
  run_counters(2);
}

TEST(GlooCollectivesTest, CountersOnFourRanks) {
  run_counters(4);
}

void run_all_ops(int nproc) {
  ParallelConfig parallel;
  parallel.dp_shard = nproc;
  const WorkerResult result = run_workers("all_ops", nproc, parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  for (int r = 0; r < nproc; ++r) EXPECT_EQ(result.read_text("done" + std::to_string(r)), "ok");
}

TEST(GlooCollectivesTest, EveryOpOnTwoRanks) {
  run_all_ops(2);
}

TEST(GlooCollectivesTest, EveryOpOnFourRanks) {
  run_all_ops(4);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
