// Distributed Muon in one process: N "ranks" are N threads, each with its own Muon over its
// shard (or replica) of the same parameters, talking through ThreadCollectives, an in-process
// Collectives that exchanges tensors between the threads at a barrier and records every call.
// The reference is one single-process Muon over the full parameters with the full gradients.
//
// Equality: with Newton–Schulz in bfloat16 the wire carries u in bfloat16, exactly the cast
// Newton–Schulz starts with, and O in bfloat16, exactly what it returns; with float32
// communication both travel exactly. So the distributed step is bitwise the single-process
// step (float32 main params) when one Newton–Schulz call gives every matrix the same result
// whether it is batched with other matrices of its shape or not. That holds when the Gram
// matrices are larger than 16 x 16 (LibTorch 1.13 sends a bfloat16 bmm through oneDNN above
// 16^3 multiply-adds per batch and through its own loop below, and the batch size counts), and
// for any matrix alone in its shape. The shapes below respect that. Stated tolerances, with
// their reasons next to the tests: float32 Newton–Schulz over a bfloat16 wire
// (kBf16WireTolerance), small same-shape bfloat16 batches (SmallBatchedShapes...), bfloat16
// params updated in place (Bfloat16ParamsWithoutMainParams...).
#include "mixtrain/optim/distributed_muon.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/mixed_precision_optimizer.h"
#include "mixtrain/optim/muon.h"
#include "mixtrain/optim/muon_config.h"
#include "mixtrain/optim/muon_owner_plan.h"
#include "mixtrain/optim/muon_telemetry.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using torch::optim::OptimizerParamGroup;

at::Tensor random_normal(at::IntArrayRef shape, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen, at::kFloat);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0.0;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         (a.numel() == 0 || at::equal(a, b));
}

// ---- an in-process N-rank Collectives ----

// What one rank posted for one collective.
struct Post {
  std::string op;
  at::Tensor tensor;
  std::vector<int64_t> send_counts;
  std::vector<int64_t> recv_counts;
};

// A record of one call, for the tests.
struct Call {
  std::string op;
  c10::ScalarType dtype;
  std::vector<int64_t> send_counts;
  std::vector<int64_t> recv_counts;
};

// The shared half: a reusable barrier and one slot per rank. A collective is post, barrier,
// read everyone's post, barrier. Waits time out (a test bug must fail, not hang).
class Exchange {
 public:
  explicit Exchange(int n) : n_(n), slots_(n) {}
  int size() const { return n_; }

  std::vector<Post> exchange(int rank, Post post) {
    slots_[rank] = std::move(post);
    wait();
    std::vector<Post> all = slots_;  // tensors are shared handles; nobody writes them
    wait();
    return all;
  }

 private:
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return generation_ != generation; })) {
      throw std::runtime_error("ThreadCollectives: a rank did not reach the collective");
    }
  }

  int n_;
  std::vector<Post> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

class ThreadCollectives final : public Collectives {
 public:
  ThreadCollectives(std::shared_ptr<Exchange> exchange, int rank)
      : exchange_(std::move(exchange)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return exchange_->size(); }
  std::string name() const override { return "threads"; }
  const std::vector<Call>& calls() const { return calls_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    auto all = run({op == ReduceOp::kSum ? "all_reduce_sum" : "all_reduce_max", tensor, {}, {}});
    at::Tensor result = op == ReduceOp::kSum ? at::zeros_like(tensor) : all[0].tensor.clone();
    for (const auto& post : all) {
      if (op == ReduceOp::kSum) {
        result.add_(post.tensor);
      } else {
        result = at::maximum(result, post.tensor);
      }
    }
    tensor.copy_(result);
  }
  at::Tensor all_gather(const at::Tensor& local) override {
    auto all = run({"all_gather", local, {}, {}});
    std::vector<at::Tensor> parts;
    for (const auto& post : all) {
      if (post.tensor.sizes() != local.sizes()) fail("all_gather: unequal shapes");
      parts.push_back(post.tensor);
    }
    return at::cat(parts);
  }
  at::Tensor reduce_scatter_sum(const at::Tensor& full) override {
    auto all = run({"reduce_scatter_sum", full, {}, {}});
    const int64_t chunk = full.size(0) / size();
    at::Tensor sum = at::zeros_like(full.narrow(0, 0, chunk));
    for (const auto& post : all) sum.add_(post.tensor.narrow(0, rank_ * chunk, chunk));
    return sum;
  }
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts) override {
    auto all = run({"all_to_all", input, send_counts, recv_counts});
    std::vector<at::Tensor> parts;
    for (int j = 0; j < size(); ++j) {
      const Post& post = all[j];
      int64_t offset = 0;
      for (int r = 0; r < rank_; ++r) offset += post.send_counts[r];
      if (post.send_counts[rank_] != recv_counts[j]) {
        fail("all_to_all: rank " + std::to_string(j) + " sends " +
             std::to_string(post.send_counts[rank_]) + " rows to rank " + std::to_string(rank_) +
             ", which expects " + std::to_string(recv_counts[j]));
      }
      parts.push_back(post.tensor.narrow(0, offset, recv_counts[j]));
    }
    return at::cat(parts).contiguous();
  }
  void broadcast(at::Tensor& tensor, int root) override {
    auto all = run({"broadcast", tensor, {}, {}});
    tensor.copy_(all[root].tensor);
  }
  void barrier() override { run({"barrier", at::Tensor(), {}, {}}); }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::logic_error("ThreadCollectives rank " + std::to_string(rank_) + ": " + what);
  }
  std::vector<Post> run(Post post) {
    if (post.tensor.defined() && !post.tensor.is_contiguous()) fail(post.op + ": not contiguous");
    calls_.push_back({post.op, post.tensor.defined() ? post.tensor.scalar_type() : at::kByte,
                      post.send_counts, post.recv_counts});
    const std::string op = post.op;
    // A snapshot: the caller may overwrite its tensor (all_reduce_sum) while others still read.
    if (post.tensor.defined()) post.tensor = post.tensor.clone();
    auto all = exchange_->exchange(rank_, std::move(post));
    for (const auto& other : all) {
      if (other.op != op) fail("rank called " + op + ", another " + other.op);
      if (other.tensor.defined() && other.tensor.scalar_type() != all[0].tensor.scalar_type()) {
        fail(op + ": ranks send different dtypes");
      }
    }
    return all;
  }

  std::shared_ptr<Exchange> exchange_;
  int rank_;
  std::vector<Call> calls_;
};

std::vector<std::shared_ptr<ThreadCollectives>> make_thread_group(int n) {
  auto exchange = std::make_shared<Exchange>(n);
  std::vector<std::shared_ptr<ThreadCollectives>> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(std::make_shared<ThreadCollectives>(exchange, r));
  return ranks;
}

// Runs body(rank) on n threads at once; rethrows the first exception.
void run_ranks(int n, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

at::Tensor dim0_chunk(const at::Tensor& full, int rank, int n) {
  const auto rows = fsdp_chunk_rows(full.size(0), n);
  int64_t start = 0;
  for (int r = 0; r < rank; ++r) start += rows[r];
  return full.narrow(0, start, rows[rank]).clone();
}

// ---- the pure parts ----

TEST(FsdpChunkRowsTest, TorchChunkSemantics) {
  EXPECT_EQ(fsdp_chunk_rows(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(fsdp_chunk_rows(5, 4), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(fsdp_chunk_rows(9, 4), (std::vector<int64_t>{3, 3, 3, 0}));
  EXPECT_EQ(fsdp_chunk_rows(10, 3), (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(fsdp_chunk_rows(1, 2), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(fsdp_chunk_rows(7, 1), (std::vector<int64_t>{7}));
  EXPECT_THROW(fsdp_chunk_rows(4, 0), std::invalid_argument);
}

TEST(MuonOwnerPlanTest, NewtonSchulzFlopsAreTheThreeGemmsPerIteration) {
  // 3 x 5 (already wide: m 3, n 5), 2 iterations: X X^T 2*3*3*5 = 90, A A 2*3*3*3 = 54,
  // B X 2*3*3*5 = 90 per iteration.
  EXPECT_EQ(newton_schulz_flops(3, 5, 2), 2 * (90 + 54 + 90));
  EXPECT_EQ(newton_schulz_flops(5, 3, 2), 2 * (90 + 54 + 90));  // tall: transposed first
  EXPECT_EQ(newton_schulz_flops(1, 384, 5), 5 * (2 * 384 + 2 + 2 * 384));
  EXPECT_EQ(newton_schulz_flops(0, 7, 5), 0);
  EXPECT_THROW(newton_schulz_flops(-1, 7, 5), std::invalid_argument);
}

TEST(MuonOwnerPlanTest, LongestFirstToTheLeastLoadedRank) {
  // FLOPs 7, 5, 4, 3, 3, 2 on 2 ranks (sum 24, mean 12), one element each, so the bucket bound
  // (the largest numel, 1) lets each owner take one item per bucket. By hand: 7 -> r0; 5 -> r1;
  // 4 -> r1 (5 < 7; r1 is full in bucket 0: bucket 1); 3 -> r0 (7 < 9); 3 -> r1 (9 < 10; r1 full
  // in bucket 1: bucket 2); 2 -> r0 (10 < 12). Totals 12 and 12. Round-robin over numel order
  // (the earlier plan) gave 2+3+5 = 10 and 3+4+7 = 14.
  const std::vector<MuonOwnerItem> items = {{1, "c", 4}, {1, "a", 7}, {1, "f", 2},
                                            {1, "d", 3}, {1, "b", 5}, {1, "e", 3}};
  const auto plan = muon_owner_plan(items, 2, 0);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].items, (std::vector<size_t>{1, 4}));  // a, b
  EXPECT_EQ(plan[0].owners, (std::vector<int>{0, 1}));
  EXPECT_EQ(plan[1].items, (std::vector<size_t>{0, 3}));  // c, d
  EXPECT_EQ(plan[1].owners, (std::vector<int>{1, 0}));
  EXPECT_EQ(plan[2].items, (std::vector<size_t>{5, 2}));  // e, f
  EXPECT_EQ(plan[2].owners, (std::vector<int>{1, 0}));
  const MuonOwnerLoad load = muon_owner_load(items, plan, 2);
  EXPECT_EQ(load.per_rank, (std::vector<int64_t>{12, 12}));
  EXPECT_DOUBLE_EQ(load.max_over_mean, 1.0);
  EXPECT_DOUBLE_EQ(load.bucket_max_sum_over_mean, (7.0 + 4.0 + 3.0) / 12.0);
}

TEST(MuonOwnerPlanTest, TheCacheComputesAPlanOnlyWhenItsInputsChange) {
  std::vector<MuonOwnerItem> items = {{1, "c", 4}, {1, "a", 7}, {1, "f", 2}, {1, "b", 5}};
  MuonOwnerPlanCache cache;
  const auto expect_fresh = [&](int ranks, int64_t bound, int64_t computed) {
    const std::vector<MuonOwnerBucket>& plan = cache.plan(items, ranks, bound);
    const std::vector<MuonOwnerBucket> fresh = muon_owner_plan(items, ranks, bound);
    ASSERT_EQ(plan.size(), fresh.size());
    for (size_t b = 0; b < plan.size(); ++b) {
      EXPECT_EQ(plan[b].items, fresh[b].items);
      EXPECT_EQ(plan[b].owners, fresh[b].owners);
    }
    EXPECT_EQ(cache.plans_computed(), computed);
  };
  expect_fresh(2, 0, 1);
  expect_fresh(2, 0, 1);  // the same inputs: no new plan
  expect_fresh(3, 0, 2);  // ranks
  expect_fresh(3, 2, 3);  // bucket bound
  items[2].flops = 9;     // a cost
  expect_fresh(3, 2, 4);
  items[0].name = "z";  // a name (breaks ties)
  expect_fresh(3, 2, 5);
  items[3].numel = 4;  // a size
  expect_fresh(3, 2, 6);
  items.pop_back();  // a parameter without a gradient this step
  expect_fresh(3, 2, 7);
  expect_fresh(3, 2, 7);
  EXPECT_THROW(cache.plan(items, 0, 2), std::invalid_argument);
  expect_fresh(3, 2, 7);  // a refused input leaves the cached plan
}

TEST(MuonOwnerPlanTest, SeveralMatricesPerOwnerAndRanksOwningNothing) {
  // One large matrix (10 elements, the bound) and small ones: the small ones all fit the
  // least-loaded rank's room in bucket 0, so rank 1 owns four there.
  const std::vector<MuonOwnerItem> mixed = {
      {10, "big", 100}, {2, "s1", 10}, {2, "s2", 10}, {2, "s3", 10}, {2, "s4", 10}};
  const auto two = muon_owner_plan(mixed, 2, 0);
  ASSERT_EQ(two.size(), 1u);
  EXPECT_EQ(two[0].owners, (std::vector<int>{0, 1, 1, 1, 1}));
  // Four equal-sized matrices on 3 ranks: the fourth goes to rank 0 (ties: lowest rank) whose
  // room in bucket 0 is used up, so bucket 1 holds it alone: ranks 1 and 2 own nothing there.
  const std::vector<MuonOwnerItem> four = {
      {10, "a", 100}, {10, "b", 100}, {10, "c", 100}, {10, "d", 50}};
  const auto three = muon_owner_plan(four, 3, 0);
  ASSERT_EQ(three.size(), 2u);
  EXPECT_EQ(three[0].owners, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(three[1].items, (std::vector<size_t>{3}));
  EXPECT_EQ(three[1].owners, (std::vector<int>{0}));
  const MuonOwnerLoad load = muon_owner_load(four, three, 3);
  EXPECT_EQ(load.per_rank, (std::vector<int64_t>{150, 100, 100}));
  EXPECT_DOUBLE_EQ(load.max_over_mean, 150.0 / (350.0 / 3));
  EXPECT_TRUE(muon_owner_plan({}, 4).empty());
  EXPECT_THROW(muon_owner_plan(four, 0), std::invalid_argument);
  EXPECT_THROW(muon_owner_plan(four, 2, -1), std::invalid_argument);
}

TEST(MuonOwnerPlanTest, MinimumBucketBoundLetsSmallMatricesShareABucket) {
  // The items of LongestFirstToTheLeastLoadedRank (one element each, FLOPs 7 5 4 3 3 2) with
  // min_bucket_numel 2: each owner assembles up to 2 per bucket. By hand: 7 -> r0; 5 -> r1;
  // 4 -> r1 (5 < 7; r1 holds 2 now); 3 -> r0 (7 < 9; r0 holds 2); 3 -> r1 (9 < 10, full:
  // bucket 1); 2 -> r0 (10 < 12). The same owners and totals as the bound 1, two buckets.
  const std::vector<MuonOwnerItem> items = {{1, "c", 4}, {1, "a", 7}, {1, "f", 2},
                                            {1, "d", 3}, {1, "b", 5}, {1, "e", 3}};
  const auto plan = muon_owner_plan(items, 2, 2);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].items, (std::vector<size_t>{1, 4, 0, 3}));  // a, b, c, d
  EXPECT_EQ(plan[0].owners, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(plan[1].items, (std::vector<size_t>{5, 2}));  // e, f
  EXPECT_EQ(plan[1].owners, (std::vector<int>{1, 0}));
  EXPECT_EQ(muon_owner_load(items, plan, 2).per_rank, (std::vector<int64_t>{12, 12}));
  // The default bound (2^20 elements) holds them all in one bucket; a matrix larger than it
  // still bounds by itself: two of 3 * 2^19 elements on one rank take two buckets.
  EXPECT_EQ(muon_owner_plan(items, 2).size(), 1u);
  const int64_t big = 3 * (int64_t{1} << 19);
  EXPECT_EQ(muon_owner_plan({{big, "x", 9}, {big, "y", 8}}, 1).size(), 2u);
  EXPECT_EQ(muon_owner_plan({{big, "x", 9}, {big, "y", 8}}, 2).size(), 1u);
}

TEST(MuonOwnerPlanTest, DeterministicWhateverTheInputOrder) {
  // Every rank lists its parameters in its own order (the same here, but the plan must not
  // depend on it): the plan, read by name, is the same for every permutation; equal FLOPs are
  // ordered by name.
  std::vector<MuonOwnerItem> items = {{6, "w.q", 60},  {6, "w.k", 60}, {3, "w.v", 30},
                                      {9, "w.up", 90}, {1, "w.g", 1},  {3, "w.o", 30}};
  auto by_name = [](const std::vector<MuonOwnerItem>& list, int ranks) {
    std::vector<std::pair<std::string, int>> named;
    for (const auto& bucket : muon_owner_plan(list, ranks, 0)) {
      for (size_t j = 0; j < bucket.items.size(); ++j) {
        named.emplace_back(list[bucket.items[j]].name, bucket.owners[j]);
      }
      named.emplace_back("|", -1);  // bucket boundary
    }
    return named;
  };
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const auto expected = by_name(items, ranks);
    std::vector<MuonOwnerItem> permuted = items;
    std::sort(permuted.begin(), permuted.end(),
              [](const MuonOwnerItem& a, const MuonOwnerItem& b) { return a.name > b.name; });
    EXPECT_EQ(by_name(permuted, ranks), expected) << ranks;
    std::rotate(permuted.begin(), permuted.begin() + 2, permuted.end());
    EXPECT_EQ(by_name(permuted, ranks), expected) << ranks;
  }
  // w.k before w.q (equal FLOPs): on 2 ranks w.up -> 0, w.k -> 1, w.q -> 1 (60 < 90).
  const auto two = by_name(items, 2);
  EXPECT_EQ(two[0], (std::pair<std::string, int>{"w.up", 0}));
  EXPECT_EQ(two[1], (std::pair<std::string, int>{"w.k", 1}));
}

TEST(MuonCommunicationDtypeTest, ParsesBfloat16AndFloat32Only) {
  EXPECT_EQ(parse_muon_communication_dtype("bfloat16"), at::kBFloat16);
  EXPECT_EQ(parse_muon_communication_dtype("float32"), at::kFloat);
  EXPECT_THROW(parse_muon_communication_dtype("float16"), std::invalid_argument);
  EXPECT_THROW(parse_muon_communication_dtype("int8"), std::invalid_argument);
  EXPECT_EQ(MuonOptions().communication_dtype(), at::kBFloat16);
  EXPECT_THROW(Muon({at::zeros({2, 2})}, MuonOptions().communication_dtype(at::kHalf)),
               std::invalid_argument);
}

// ---- equality with single-process Muon ----

struct NamedShape {
  std::string name;
  std::vector<int64_t> shape;
};

// Uneven chunks for every n in 2..4 (37 rows), ranks without rows (9 rows at n = 4: 3, 3, 3, 0;
// 5 rows at n = 4: 2, 2, 1, 0), three 64 x 48 (one batch of three in the reference), tall and
// wide matrices (Newton–Schulz transposes the tall ones). Seven params: the last bucket is
// partial for n = 2, 3, 4.
const std::vector<NamedShape> kShapes = {
    {"layers.0.q", {64, 48}},  {"layers.0.k", {37, 29}}, {"layers.1.q", {64, 48}},
    {"layers.0.o", {9, 40}},   {"layers.1.o", {5, 24}},  {"layers.2.q", {64, 48}},
    {"layers.0.up", {96, 40}},
};

// The owner plan of kShapes (muon_owner_plan.h; ns_steps 5), by hand. FLOPs per matrix
// (4 m^2 n + 2 m^3) x 5: 64x48 4055040 (three: layers.0.q, .1.q, .2.q), 96x40 3712000 (up),
// 37x29 866230 (k), 9x40 72090 (layers.0.o), 5x24 13250 (layers.1.o); bucket bound 3840
// elements (up). Owners, longest first to the least-loaded rank:
//   n = 1: q0 | q1 | q2 | up | k, o0, o1                 (each q or up fills a bucket): 5
//   n = 2: q0->0 q1->1 | q2->0 up->1 | k->1 o0->0 o1->0                                  : 3
//   n = 3: q0->0 q1->1 q2->2 | up->0 k->1 o0->2 o1->2    (rank 2 owns two in bucket 1)   : 2
//   n = 4: q0->0 q1->1 q2->2 up->3 | k->3 o0->0 o1->1    (rank 2 owns none in bucket 1)  : 2
const std::vector<size_t> kShapesBuckets = {0, 5, 3, 2, 2};

struct RunSetup {
  MuonOptions options;
  bool two_groups = false;  // second half of the params in a group with its own lr and wd
  std::vector<MuonHeadSplit> head_splits;  // per shape (muon_per_head); empty: none
  int64_t min_bucket_numel = 0;  // the plan's bound is then the largest matrix: several buckets
};

void set_head_splits(Muon& muon, const std::vector<at::Tensor>& params, const RunSetup& setup) {
  for (size_t i = 0; i < setup.head_splits.size(); ++i) {
    muon.set_head_split(params[i], setup.head_splits[i]);
  }
}

// The param groups of `params` as `setup` says: one group, or (two_groups) the first half and
// the second half, the second with half the lr and weight decay 0.2.
std::vector<OptimizerParamGroup> param_groups(const std::vector<at::Tensor>& params,
                                              const RunSetup& setup) {
  std::vector<OptimizerParamGroup> groups;
  if (!setup.two_groups) {
    groups.emplace_back(params);
    return groups;
  }
  const size_t half = params.size() / 2;
  groups.emplace_back(std::vector<at::Tensor>(params.begin(), params.begin() + half));
  MuonOptions second = setup.options;
  second.lr(setup.options.lr() * 0.5).weight_decay(0.2);
  groups.emplace_back(std::vector<at::Tensor>(params.begin() + half, params.end()),
                      std::make_unique<MuonOptions>(second));
  return groups;
}

// Single-process Muon on the full params for `steps` steps; returns the final params.
// normuon_v: if given, each param's NorMuon state after the run.
std::vector<at::Tensor> reference_run(const std::vector<NamedShape>& shapes, const RunSetup& setup,
                                      int steps, at::ScalarType dtype,
                                      std::vector<at::Tensor>* normuon_v = nullptr) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < shapes.size(); ++i) {
    params.push_back(random_normal(shapes[i].shape, 100 + i).to(dtype));
  }
  Muon muon(param_groups(params, setup), setup.options);
  set_head_splits(muon, params, setup);
  for (int step = 1; step <= steps; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = random_normal(shapes[i].shape, 1000 * step + i);
    }
    muon.step();
  }
  if (normuon_v) {
    normuon_v->clear();
    for (const auto& p : params) normuon_v->push_back(muon.export_state(p).at(2).second.clone());
  }
  return params;
}

// The same on n thread-ranks; kFsdp: each rank holds its dim-0 chunk, kReplicated: a copy.
// Returns, per rank, its final params; calls[r] = the collectives rank r made.
std::vector<std::vector<at::Tensor>> distributed_run(
    const std::vector<NamedShape>& shapes, const RunSetup& setup, int steps, int n,
    MuonSharding::Kind kind, at::ScalarType dtype, std::vector<std::vector<Call>>* calls,
    std::vector<std::vector<at::Tensor>>* normuon_v = nullptr) {
  auto group = make_thread_group(n);
  std::vector<std::vector<at::Tensor>> result(n);
  if (normuon_v) normuon_v->assign(n, {});
  run_ranks(n, [&](int rank) {
    std::vector<at::Tensor> params;
    for (size_t i = 0; i < shapes.size(); ++i) {
      at::Tensor full = random_normal(shapes[i].shape, 100 + i).to(dtype);
      params.push_back(kind == MuonSharding::Kind::kFsdp ? dim0_chunk(full, rank, n) : full);
    }
    Muon muon(param_groups(params, setup), setup.options);
    muon.set_owner_min_bucket_numel(setup.min_bucket_numel);
    set_head_splits(muon, params, setup);  // before the sharding, as build_optimizer does
    for (size_t i = 0; i < shapes.size(); ++i) {
      muon.set_sharding(params[i], {kind, shapes[i].shape, group[rank], shapes[i].name});
    }
    for (int step = 1; step <= steps; ++step) {
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor g = random_normal(shapes[i].shape, 1000 * step + i);
        params[i].mutable_grad() = kind == MuonSharding::Kind::kFsdp ? dim0_chunk(g, rank, n) : g;
      }
      muon.step();
    }
    result[rank] = params;
    if (normuon_v) {
      for (const auto& p : params) {
        (*normuon_v)[rank].push_back(muon.export_state(p).at(2).second.clone());
      }
    }
  });
  if (calls) {
    calls->clear();
    for (const auto& g : group) calls->push_back(g->calls());
  }
  return result;
}

at::Tensor gather_rows(const std::vector<std::vector<at::Tensor>>& ranks, size_t i) {
  std::vector<at::Tensor> parts;
  for (const auto& r : ranks) parts.push_back(r[i]);
  return at::cat(parts);
}

struct Combo {
  at::ScalarType ns_dtype;
  at::ScalarType communication_dtype;
  bool bitwise;
};

// bfloat16 Newton–Schulz: the wire is bfloat16 whatever communication_dtype says (exact).
// float32 Newton–Schulz with float32 wire: exact. float32 Newton–Schulz with a bfloat16 wire:
// u and O are rounded to bfloat16 once each. O's rounding moves each element by at most half
// a bfloat16 ulp, 2^-9 * |O| with |O| <= ~1.2; u's relative rounding of 2^-9 moves the
// orthogonalized result by a similar amount. Allowed per step: lr*scale * 2^-8 * 1.2 with the
// largest lr*scale here (0.02 * 0.2 * sqrt(96) = 0.039): 1.8e-4 per step, 5.5e-4 for three.
// Measured: 8.9e-5 after three steps.
constexpr double kBf16WireTolerance = 3 * 0.039 * 1.2 / 256;
const std::vector<Combo> kCombos = {
    {at::kBFloat16, at::kBFloat16, true},
    {at::kBFloat16, at::kFloat, true},
    {at::kFloat, at::kFloat, true},
    {at::kFloat, at::kBFloat16, false},
};

// lr 0.02, weight decay 0.1, the combo's dtypes, two groups.
RunSetup combo_setup(const Combo& combo) {
  RunSetup setup;
  setup.options = MuonOptions()
                      .lr(0.02)
                      .weight_decay(0.1)
                      .ns_dtype(combo.ns_dtype)
                      .communication_dtype(combo.communication_dtype);
  setup.two_groups = true;
  return setup;
}

// `got` equals `expected` bitwise where the combo is exact, else within kBf16WireTolerance.
void expect_combo_equal(const at::Tensor& got, const at::Tensor& expected, const Combo& combo,
                        const std::string& what) {
  if (combo.bitwise) {
    EXPECT_TRUE(bitwise_equal(got, expected))
        << what << ": max diff " << max_abs_diff(got, expected);
  } else {
    EXPECT_LT(max_abs_diff(got, expected), kBf16WireTolerance) << what;
  }
}

TEST(DistributedMuonFsdpTest, EqualsSingleProcessMuonForOneToFourRanks) {
  for (const auto& combo : kCombos) {
    const RunSetup setup = combo_setup(combo);
    const auto expected = reference_run(kShapes, setup, 3, at::kFloat);
    for (int n = 1; n <= 4; ++n) {
      std::vector<std::vector<Call>> calls;
      const auto got =
          distributed_run(kShapes, setup, 3, n, MuonSharding::Kind::kFsdp, at::kFloat, &calls);
      for (size_t i = 0; i < kShapes.size(); ++i) {
        const at::Tensor full = gather_rows(got, i);
        const std::string what = "n=" + std::to_string(n) + " ns " + c10::toString(combo.ns_dtype) +
                                 " wire " + c10::toString(combo.communication_dtype) + " " +
                                 kShapes[i].name;
        expect_combo_equal(full, expected[i], combo, what);
      }
      // The parameter check on the first step only (the same parameters on every later step),
      // then per step two all_to_alls per bucket of the plan.
      const size_t buckets = kShapesBuckets[n];
      const c10::ScalarType wire =
          combo.ns_dtype == at::kBFloat16 ? at::kBFloat16 : combo.communication_dtype;
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(calls[r].size(), 1 + 3 * 2 * buckets) << "rank " << r;
        EXPECT_EQ(calls[r][0].op, "all_reduce_sum");
        for (size_t c = 1; c < calls[r].size(); ++c) {
          EXPECT_EQ(calls[r][c].op, "all_to_all");
          EXPECT_EQ(calls[r][c].dtype, wire);
        }
      }
    }
  }
}

// NorMuon is exact, not per shard: the owner normalizes the whole matrix with the whole
// matrix's v rows (each rank's rows travel with its u), and each rank keeps the new v of its
// rows. Every Newton-Schulz dtype and wire setting: a NorMuon bucket travels in float32, so the
// result is the single-process one bit for bit (params and v), cautious decay included. DDP:
// the owner appends the new v rows to the all_gather; every replica keeps all rows.
TEST(DistributedMuonNorMuonTest, FsdpAndDdpEqualOneProcessBitwiseParamsAndState) {
  for (const auto& combo : kCombos) {
    RunSetup setup = combo_setup(combo);
    setup.options.normuon(true).cautious_weight_decay(true);
    std::vector<at::Tensor> expected_v;
    const auto expected = reference_run(kShapes, setup, 3, at::kFloat, &expected_v);
    for (int n = 2; n <= 4; n += 2) {
      std::vector<std::vector<Call>> calls;
      std::vector<std::vector<at::Tensor>> v;
      const auto got =
          distributed_run(kShapes, setup, 3, n, MuonSharding::Kind::kFsdp, at::kFloat, &calls, &v);
      for (size_t i = 0; i < kShapes.size(); ++i) {
        const std::string what = "fsdp n=" + std::to_string(n) + " ns " +
                                 c10::toString(combo.ns_dtype) + " wire " +
                                 c10::toString(combo.communication_dtype) + " " + kShapes[i].name;
        EXPECT_TRUE(bitwise_equal(gather_rows(got, i), expected[i]))
            << what << ": max diff " << max_abs_diff(gather_rows(got, i), expected[i]);
        EXPECT_TRUE(bitwise_equal(gather_rows(v, i), expected_v[i])) << what << " normuon_v";
      }
      for (size_t c = 1; c < calls[0].size(); ++c) {
        if (calls[0][c].op == "all_to_all") {
          EXPECT_EQ(calls[0][c].dtype, at::kFloat);
        }
      }
      const auto replicas = distributed_run(kShapes, setup, 3, n, MuonSharding::Kind::kReplicated,
                                            at::kFloat, nullptr, &v);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < kShapes.size(); ++i) {
          const std::string what = "ddp n=" + std::to_string(n) + " rank " + std::to_string(r) +
                                   " " + c10::toString(combo.ns_dtype) + " " + kShapes[i].name;
          EXPECT_TRUE(bitwise_equal(replicas[r][i], expected[i])) << what;
          EXPECT_TRUE(bitwise_equal(v[r][i], expected_v[i])) << what << " normuon_v";
        }
      }
    }
  }
}

TEST(DistributedMuonFsdpTest, BucketsOwnersAndARankOwningNothing) {
  // n = 4 (kShapesBuckets): bucket 0 = layers.0.q -> 0, layers.1.q -> 1, layers.2.q -> 2,
  // up -> 3; bucket 1 = k -> 3, layers.0.o -> 0, layers.1.o -> 1: rank 2 owns nothing there but
  // takes part in both all_to_alls. Calls: check, u0, u1 (started before bucket 0's
  // Newton-Schulz), O0, O1.
  RunSetup setup;
  setup.options = MuonOptions().lr(0.02);
  std::vector<std::vector<Call>> calls;
  distributed_run(kShapes, setup, 1, 4, MuonSharding::Kind::kFsdp, at::kFloat, &calls);
  ASSERT_EQ(calls[0].size(), 5u);
  // Rows per rank: 64x48 {16,16,16,16} (768 elements each), 96x40 {24,24,24,24} (960),
  // 37x29 {10,10,10,7} (290, 290, 290, 203), 9x40 {3,3,3,0} (120), 5x24 {2,2,1,0} (48, 48, 24).
  // Bucket 0: rank 2 sends its rows of each q to its owner and of up to rank 3; owns layers.2.q.
  EXPECT_EQ(calls[2][1].send_counts, (std::vector<int64_t>{768, 768, 768, 960}));
  EXPECT_EQ(calls[2][1].recv_counts, (std::vector<int64_t>{768, 768, 768, 768}));
  // Bucket 1: rank 2 sends o0 rows to rank 0, its one o1 row to rank 1, k rows to rank 3 and
  // receives nothing.
  EXPECT_EQ(calls[2][2].send_counts, (std::vector<int64_t>{120, 24, 0, 290}));
  EXPECT_EQ(calls[2][2].recv_counts, (std::vector<int64_t>{0, 0, 0, 0}));
  // Rank 3 holds no row of o0 or o1 and owns k; rank 1 owns o1.
  EXPECT_EQ(calls[3][2].send_counts, (std::vector<int64_t>{0, 0, 0, 203}));
  EXPECT_EQ(calls[3][2].recv_counts, (std::vector<int64_t>{290, 290, 290, 203}));
  EXPECT_EQ(calls[1][2].recv_counts, (std::vector<int64_t>{48, 48, 24, 0}));
  // The way back mirrors each bucket: O0 is call 3, O1 call 4.
  for (int r = 0; r < 4; ++r) {
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(calls[r][3 + k].send_counts, calls[r][1 + k].recv_counts) << r << " " << k;
      EXPECT_EQ(calls[r][3 + k].recv_counts, calls[r][1 + k].send_counts) << r << " " << k;
    }
  }
}

// Many matrices per owner and bucket (the small ones of a layer share a bucket), on 3 and 4
// ranks, float32 Newton-Schulz and wire: bitwise the single process. Shapes: Gram matrices
// above 16 x 16 or alone in their shape (see the top of the file).
TEST(DistributedMuonFsdpTest, SeveralMatricesPerOwnerEqualOneProcessBitwise) {
  std::vector<NamedShape> shapes;
  for (int layer = 0; layer < 3; ++layer) {
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    shapes.push_back({prefix + "q", {48, 40}});
    shapes.push_back({prefix + "k", {24, 40}});
    shapes.push_back({prefix + "v", {24, 40}});
    shapes.push_back({prefix + "up", {80, 40}});
  }
  shapes.push_back({"router", {3, 40}});
  RunSetup setup;
  setup.options =
      MuonOptions().lr(0.02).weight_decay(0.1).ns_dtype(at::kFloat).communication_dtype(at::kFloat);
  const auto expected = reference_run(shapes, setup, 2, at::kFloat);
  for (int n : {3, 4}) {
    std::vector<std::vector<Call>> calls;
    const auto got =
        distributed_run(shapes, setup, 2, n, MuonSharding::Kind::kFsdp, at::kFloat, &calls);
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(gather_rows(got, i), expected[i]))
          << "n=" << n << " " << shapes[i].name << ": max diff "
          << max_abs_diff(gather_rows(got, i), expected[i]);
    }
    // Fewer buckets than matrices / n would need at one matrix per owner and bucket.
    EXPECT_LT(calls[0].size(), 2 * (1 + 2 * ((shapes.size() + n - 1) / n))) << n;
  }
}

TEST(DistributedMuonFsdpTest, MomentumStylesAndPlainMomentum) {
  for (const auto style : {MomentumStyle::kEma, MomentumStyle::kEmaAdd, MomentumStyle::kSum}) {
    for (bool nesterov : {true, false}) {
      RunSetup setup;
      setup.options = MuonOptions()
                          .lr(0.01)
                          .weight_decay(0.05)
                          .momentum_style(style)
                          .nesterov(nesterov)
                          .ns_variant("legacy")
                          .adjust_lr_fn(AdjustLrFn::kOriginal);
      const auto expected = reference_run(kShapes, setup, 2, at::kFloat);
      const auto got =
          distributed_run(kShapes, setup, 2, 3, MuonSharding::Kind::kFsdp, at::kFloat, nullptr);
      for (size_t i = 0; i < kShapes.size(); ++i) {
        EXPECT_TRUE(bitwise_equal(gather_rows(got, i), expected[i]))
            << momentum_style_name(style) << " nesterov " << nesterov << " " << kShapes[i].name;
      }
    }
  }
}

// bfloat16 params updated in place (no fp32 main params): not bitwise, because LibTorch's
// bfloat16 elementwise kernels round differently in the scalar tail of a contiguous run than
// in its vector body (the tail computes a + alpha*b as two bfloat16 roundings, the body as one
// fused float op), and a shard's tail sits at other elements than the full tensor's. That moves
// a few elements of the Nesterov u and of p by one bfloat16 ulp. Measured over two steps:
// only the matrices whose shards end off a 32-element boundary differ, 4-13% of their
// elements, each by at most one ulp of its value (2^-7 for values in [1, 2)). Allowed: one ulp
// of the largest value per step, and the divisible shapes stay bitwise.
TEST(DistributedMuonFsdpTest, Bfloat16ParamsWithoutMainParamsWithinOneUlpPerStep) {
  RunSetup setup;
  setup.options = MuonOptions().lr(0.02).weight_decay(0.1);
  const int steps = 2;
  const auto expected = reference_run(kShapes, setup, steps, at::kBFloat16);
  const auto got =
      distributed_run(kShapes, setup, steps, 4, MuonSharding::Kind::kFsdp, at::kBFloat16, nullptr);
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const at::Tensor full = gather_rows(got, i);
    const double max_value = expected[i].abs().max().item<double>();
    const double ulp = std::exp2(std::floor(std::log2(max_value)) - 7);
    EXPECT_LE(max_abs_diff(full, expected[i]), steps * ulp) << kShapes[i].name;
    if (kShapes[i].shape[0] % 4 == 0 && (kShapes[i].shape[0] / 4 * kShapes[i].shape[1]) % 32 == 0) {
      EXPECT_TRUE(bitwise_equal(full, expected[i])) << kShapes[i].name;
    }
  }
}

// muon_per_head: q (3 heads of 24 rows), k (2, GQA) and o (3 heads of 24 columns), and a
// whole matrix. The owner splits the matrix it assembled; the reference batches the heads of
// every same-shape param into one call. float32 Newton–Schulz over a float32 wire is exact,
// so bitwise for every n (heads are 24 x 40: larger than 16 x 16, so bfloat16 is batch-
// invariant too and travels exactly).
const std::vector<NamedShape> kHeadShapes = {{"layers.0.self_attn.q_proj.weight", {72, 40}},
                                             {"layers.0.self_attn.k_proj.weight", {48, 40}},
                                             {"layers.0.self_attn.o_proj.weight", {40, 72}},
                                             {"layers.0.up", {37, 29}}};
const std::vector<MuonHeadSplit> kHeadSplits = {{0, 24}, {0, 24}, {1, 24}, {}};

// With NorMuon and cautious decay too: the owner normalizes the merged O (the heads joined
// back into the matrix as stored), so v is per row of the parameter, as on one process.
TEST(DistributedMuonPerHeadTest, FsdpAndDdpEqualOneProcessBitwise) {
  for (const bool normuon : {false, true}) {
    for (const auto ns_dtype : {at::kFloat, at::kBFloat16}) {
      RunSetup setup;
      setup.options = MuonOptions()
                          .lr(0.02)
                          .weight_decay(0.1)
                          .ns_dtype(ns_dtype)
                          .communication_dtype(at::kFloat)
                          .adjust_lr_fn(AdjustLrFn::kOriginal)  // o's heads: sqrt(40/24)
                          .normuon(normuon)
                          .cautious_weight_decay(normuon);
      setup.head_splits = kHeadSplits;
      std::vector<at::Tensor> expected_v;
      const auto expected =
          reference_run(kHeadShapes, setup, 2, at::kFloat, normuon ? &expected_v : nullptr);
      RunSetup whole = setup;
      whole.head_splits.clear();
      const auto whole_expected = reference_run(kHeadShapes, whole, 2, at::kFloat);
      EXPECT_GT(max_abs_diff(expected[0], whole_expected[0]), 1e-4);  // the split matters
      for (const auto kind : {MuonSharding::Kind::kFsdp, MuonSharding::Kind::kReplicated}) {
        for (int n = 2; n <= 3; ++n) {
          std::vector<std::vector<at::Tensor>> v;
          const auto got = distributed_run(kHeadShapes, setup, 2, n, kind, at::kFloat, nullptr,
                                           normuon ? &v : nullptr);
          const bool fsdp = kind == MuonSharding::Kind::kFsdp;
          for (size_t i = 0; i < kHeadShapes.size(); ++i) {
            const std::string what = std::string(muon_sharding_kind_name(kind)) +
                                     " n=" + std::to_string(n) + " " + c10::toString(ns_dtype) +
                                     (normuon ? " normuon " : " ") + kHeadShapes[i].name;
            const at::Tensor full = fsdp ? gather_rows(got, i) : got[n - 1][i];
            EXPECT_TRUE(bitwise_equal(full, expected[i]))
                << what << ": max diff " << max_abs_diff(full, expected[i]);
            if (!normuon) continue;
            const at::Tensor full_v = fsdp ? gather_rows(v, i) : v[n - 1][i];
            EXPECT_TRUE(bitwise_equal(full_v, expected_v[i])) << what << " normuon_v";
          }
        }
      }
    }
  }
}

// Tensor parallel, two thread ranks: q and k column-parallel (tp_dim 0, each slice 2 heads resp.
// 1 head of 24 rows), o row-parallel (tp_dim 1, 2 heads of 24 columns each), held whole per
// data rank (kReplicated over a one-rank group, as muon_sharding_of maps kWhole with a tp
// split). Whoever orthogonalizes gathers the whole matrix, splits it into heads and keeps its
// slice: bitwise the one-process per-head step (float32 Newton–Schulz, float32 tp gather).
// NorMuon: v rows of the row-split q/k (tp_dim 0) are gathered over tp like u, o's (tp_dim 1)
// are all on each tp rank; the new rows come back sliced the same way.
TEST(DistributedMuonPerHeadTest, TensorParallelSlicesEqualOneProcessBitwise) {
  for (const bool normuon : {false, true}) {
    const std::vector<NamedShape> shapes = {{"q", {96, 40}}, {"k", {48, 40}}, {"o", {40, 96}}};
    const std::vector<int64_t> tp_dims = {0, 0, 1};
    RunSetup setup;
    setup.options = MuonOptions()
                        .lr(0.02)
                        .weight_decay(0.1)
                        .ns_dtype(at::kFloat)
                        .communication_dtype(at::kFloat)
                        .adjust_lr_fn(AdjustLrFn::kOriginal)
                        .normuon(normuon)
                        .cautious_weight_decay(normuon);
    setup.head_splits = {{0, 24}, {0, 24}, {1, 24}};
    std::vector<at::Tensor> expected_v;
    const auto expected =
        reference_run(shapes, setup, 2, at::kFloat, normuon ? &expected_v : nullptr);
    const int n = 2;
    auto tp = make_thread_group(n);
    std::vector<std::vector<at::Tensor>> got(n), got_v(n);
    run_ranks(n, [&](int rank) {
      auto slice = [&](const at::Tensor& full, size_t i) {
        return full.chunk(n, tp_dims[i])[rank].contiguous();
      };
      std::vector<at::Tensor> params;
      for (size_t i = 0; i < shapes.size(); ++i) {
        params.push_back(slice(random_normal(shapes[i].shape, 100 + i), i));
      }
      Muon muon(params, setup.options);
      set_head_splits(muon, params, setup);
      for (size_t i = 0; i < shapes.size(); ++i) {
        MuonSharding sharding{
            MuonSharding::Kind::kReplicated, {}, make_local_collectives("one"), shapes[i].name};
        sharding.tp_dim = tp_dims[i];
        sharding.tp_group = tp[rank];
        muon.set_sharding(params[i], sharding);
      }
      for (int step = 1; step <= 2; ++step) {
        for (size_t i = 0; i < shapes.size(); ++i) {
          params[i].mutable_grad() = slice(random_normal(shapes[i].shape, 1000 * step + i), i);
        }
        muon.step();
      }
      got[rank] = params;
      for (const auto& p : params) {
        if (normuon) got_v[rank].push_back(muon.export_state(p).at(2).second.clone());
      }
    });
    for (size_t i = 0; i < shapes.size(); ++i) {
      const at::Tensor whole = at::cat({got[0][i], got[1][i]}, tp_dims[i]);
      const std::string what = (normuon ? "normuon " : "") + shapes[i].name;
      EXPECT_TRUE(bitwise_equal(whole, expected[i]))
          << what << ": max diff " << max_abs_diff(whole, expected[i]);
      if (!normuon) continue;
      // v has the param's shape without its last dim: split with q/k's rows, whole for o.
      const at::Tensor whole_v =
          tp_dims[i] == 0 ? at::cat({got_v[0][i], got_v[1][i]}) : got_v[0][i];
      EXPECT_TRUE(bitwise_equal(whole_v, expected_v[i])) << what << " normuon_v";
      if (tp_dims[i] == 1) {
        EXPECT_TRUE(bitwise_equal(got_v[0][i], got_v[1][i])) << what;
      }
    }
  }
}

TEST(DistributedMuonDdpTest, EqualsSingleProcessMuonOnEveryRank) {
  for (const auto& combo : kCombos) {
    const RunSetup setup = combo_setup(combo);
    const auto expected = reference_run(kShapes, setup, 3, at::kFloat);
    for (int n = 2; n <= 4; ++n) {
      std::vector<std::vector<Call>> calls;
      const auto got = distributed_run(kShapes, setup, 3, n, MuonSharding::Kind::kReplicated,
                                       at::kFloat, &calls);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < kShapes.size(); ++i) {
          const std::string what = "n=" + std::to_string(n) + " rank " + std::to_string(r) + " " +
                                   c10::toString(combo.ns_dtype) + "/" +
                                   c10::toString(combo.communication_dtype) + " " + kShapes[i].name;
          expect_combo_equal(got[r][i], expected[i], combo, what);
          if (!combo.bitwise) {
            EXPECT_TRUE(bitwise_equal(got[r][i], got[0][i])) << what << " vs rank 0";
          }
        }
      }
      const size_t buckets = kShapesBuckets[n];
      ASSERT_EQ(calls[0].size(), 1 + 3 * buckets);  // the check on the first step only
      EXPECT_EQ(calls[0][0].op, "all_reduce_sum");
      EXPECT_EQ(calls[0][1].op, "all_gather");
    }
  }
}

TEST(DistributedMuonExpertsTest, ThreeDimensionalShardsStayLocal) {
  // [E, A, B] expert tensors chunked over experts: whole matrices on every rank, no
  // communication; equal to the single-process step (A, B > 16, so batching does not matter).
  const std::vector<NamedShape> shapes = {{"experts.up", {6, 24, 32}},
                                          {"experts.down", {6, 32, 24}}};
  RunSetup setup;
  setup.options = MuonOptions().lr(0.02).weight_decay(0.1);
  const auto expected = reference_run(shapes, setup, 2, at::kFloat);
  for (int n : {2, 4}) {  // n = 4: chunks of 2, 2, 2, 0 experts
    std::vector<std::vector<Call>> calls;
    const auto got =
        distributed_run(shapes, setup, 2, n, MuonSharding::Kind::kFsdp, at::kFloat, &calls);
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(gather_rows(got, i), expected[i])) << n << " " << shapes[i].name;
    }
    for (const auto& c : calls) EXPECT_TRUE(c.empty());
  }
}

TEST(DistributedMuonFsdpTest, SmallBatchedShapesDifferOnlyByBfloat16Rounding) {
  // Two 16 x 24 matrices: one bfloat16 batch of two in the reference (oneDNN), alone on their
  // owners (ATen's own loop for a 16^3 Gram product): the GEMMs round differently and five
  // Newton–Schulz steps carry that on. Measured: O differs by up to 0.024 per element (p by
  // lr*scale = 0.02*0.2*sqrt(24) = 0.0196 times that); the bfloat16 bands of the Muon tests
  // allow 0.1 per element of O against the exact result, so 0.05 between two roundings.
  const std::vector<NamedShape> shapes = {{"a", {16, 24}}, {"b", {16, 24}}};
  RunSetup setup;
  setup.options = MuonOptions().lr(0.02);
  const auto expected = reference_run(shapes, setup, 1, at::kFloat);
  const auto got =
      distributed_run(shapes, setup, 1, 2, MuonSharding::Kind::kFsdp, at::kFloat, nullptr);
  const double lr_scale = 0.02 * 0.2 * std::sqrt(24.0);
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_LT(max_abs_diff(gather_rows(got, i), expected[i]), 0.05 * lr_scale) << shapes[i].name;
  }
}

// ---- wiring, copy-back and errors ----

TEST(DistributedMuonTest, ShardingSurvivesReplaceParameterAndCopyBackWritesTheShard) {
  auto group = make_thread_group(2);  // no collective runs: only the layout is checked
  at::Tensor model = random_normal({9, 40}, 5).to(at::kBFloat16);
  Muon muon(std::vector<at::Tensor>{model}, MuonOptions());
  MuonSharding layout{MuonSharding::Kind::kFsdp, {17, 40}, group[0], "w"};
  muon.set_sharding(model, layout);  // 17 rows over 2: 9, 8
  EXPECT_TRUE(muon.batches(0).empty());
  const at::Tensor main = model.to(at::kFloat);
  muon.replace_parameter(model, main);
  muon.reset_parameter_caches();
  EXPECT_EQ(muon.sharding(main).kind, MuonSharding::Kind::kFsdp);
  EXPECT_EQ(muon.sharding(main).name, "w");
  EXPECT_EQ(muon.sharding(model).kind, MuonSharding::Kind::kLocal);  // no longer in a group
}

TEST(DistributedMuonTest, SetShardingRejectsWrongLayouts) {
  auto group = make_thread_group(4);
  at::Tensor p = at::zeros({3, 8});
  Muon muon(std::vector<at::Tensor>{p}, MuonOptions());
  auto expect_error = [&](const MuonSharding& sharding, const std::string& needle) {
    try {
      muon.set_sharding(p, sharding);
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // 10 rows over 4 ranks: 3, 3, 3, 1; rank 3 must hold 1 row.
  expect_error({MuonSharding::Kind::kFsdp, {10, 8}, group[3], "w"}, "not the dim-0 chunk");
  expect_error({MuonSharding::Kind::kFsdp, {10, 9}, group[0], "w"}, "not the dim-0 chunk");
  expect_error({MuonSharding::Kind::kFsdp, {10, 8}, nullptr, "w"}, "needs a Collectives group");
  expect_error({MuonSharding::Kind::kReplicated, {4, 8}, group[0], "w"}, "differs");
  EXPECT_NO_THROW(muon.set_sharding(p, {MuonSharding::Kind::kFsdp, {10, 8}, group[2], "w"}));
  at::Tensor stranger = at::zeros({3, 8});
  EXPECT_THROW(muon.set_sharding(stranger, {}), std::invalid_argument);
}

// Muon over a and b, each this rank's half (4 of 8 rows) of an 8 x 8 matrix sharded over `group`.
Muon two_fsdp_halves(const at::Tensor& a, const at::Tensor& b,
                     const std::shared_ptr<ThreadCollectives>& group) {
  Muon muon(std::vector<at::Tensor>{a, b}, MuonOptions());
  muon.set_sharding(a, {MuonSharding::Kind::kFsdp, {8, 8}, group, "a"});
  muon.set_sharding(b, {MuonSharding::Kind::kFsdp, {8, 8}, group, "b"});
  return muon;
}

TEST(DistributedMuonTest, RanksSteppingDifferentParamsFailOnEveryRank) {
  auto group = make_thread_group(2);
  std::vector<std::string> messages(2);
  run_ranks(2, [&](int rank) {
    at::Tensor a = at::ones({4, 8});
    at::Tensor b = at::ones({4, 8});
    Muon muon = two_fsdp_halves(a, b, group[rank]);
    a.mutable_grad() = at::ones({4, 8});
    if (rank == 0) b.mutable_grad() = at::ones({4, 8});  // rank 1 has no grad for b
    try {
      muon.step();
    } catch (const std::logic_error& e) {
      messages[rank] = e.what();
    }
  });
  for (const auto& m : messages) {
    EXPECT_NE(m.find("ranks step different parameters"), std::string::npos) << m;
  }
}

// The check is a host read (its value decides whether to go on): it runs on the first step
// and again only when a rank's set of parameters with a gradient changes, here on both ranks.
TEST(DistributedMuonTest, TheParameterCheckRunsOnTheFirstStepAndWhenTheSetChanges) {
  auto group = make_thread_group(2);
  std::vector<std::vector<int64_t>> checks(2);  // all_reduce calls per step, per rank
  run_ranks(2, [&](int rank) {
    at::Tensor a = at::ones({4, 8});
    at::Tensor b = at::ones({4, 8});
    Muon muon = two_fsdp_halves(a, b, group[rank]);
    for (int step = 1; step <= 4; ++step) {
      a.mutable_grad() = at::ones({4, 8});
      b.mutable_grad() = step < 3 ? at::ones({4, 8}) : at::Tensor();  // b has none from step 3
      const size_t before = group[rank]->calls().size();
      muon.step();
      int64_t all_reduces = 0;
      for (size_t c = before; c < group[rank]->calls().size(); ++c) {
        all_reduces += group[rank]->calls()[c].op == "all_reduce_sum";
      }
      checks[rank].push_back(all_reduces);
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(checks[rank], (std::vector<int64_t>{1, 0, 1, 0})) << "rank " << rank;
  }
}

// ---- the trainer's path: build_optimizer over named params ----

// The params init(i) of `shapes` by name, requiring grad: the one-process model.
std::vector<std::pair<std::string, at::Tensor>> whole_params(
    const std::vector<NamedShape>& shapes, const std::function<at::Tensor(size_t)>& init) {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (size_t i = 0; i < shapes.size(); ++i) {
    params.emplace_back(shapes[i].name, init(i).requires_grad_(true));
  }
  return params;
}

// Rank `rank` of n's dim-0 chunk of each param init(i), requiring grad, and the kDim0Shard
// placements over `group` that set_placements takes, as the trainer hands them over.
struct RankShards {
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<ParamPlacement> layout;
};
RankShards dim0_shards(const std::vector<NamedShape>& shapes,
                       const std::function<at::Tensor(size_t)>& init, int rank, int n,
                       const std::shared_ptr<ThreadCollectives>& group) {
  RankShards shards;
  for (size_t i = 0; i < shapes.size(); ++i) {
    shards.params.emplace_back(shapes[i].name, dim0_chunk(init(i), rank, n).requires_grad_(true));
    ParamPlacement placement = whole_placement(shapes[i].name, shapes[i].shape);
    placement.kind = ParamPlacement::Kind::kDim0Shard;
    placement.shard_group = group;
    shards.layout.push_back(placement);
  }
  return shards;
}

// The ranks' main params of param i (main[rank][i], dim-0 chunks) joined equal the one-process
// main param `name` bit for bit.
void expect_main_param_equal(const std::vector<std::vector<at::Tensor>>& main,
                             const MixedPrecisionOptimizer& ref, const std::string& name,
                             size_t i) {
  EXPECT_TRUE(bitwise_equal(gather_rows(main, i), ref.main_param(name)))
      << name << ": max diff " << max_abs_diff(gather_rows(main, i), ref.main_param(name));
}

// The path the trainer takes: build_optimizer with fp32 main params on each rank's shards,
// set_placements by name, main_grad = the shard of the reduced gradient. Every model param
// (bfloat16) and main param must equal the one-process stack's.
TEST(DistributedMuonTest, MixedPrecisionStackWithSetMuonShardingEqualsOneProcess) {
  const std::vector<NamedShape> shapes = {
      {"model.embed_tokens.weight", {40, 32}},
      {"model.layers.0.self_attn.q_proj.weight", {32, 32}},
      {"model.layers.0.self_attn.q_proj.bias", {32}},
      {"model.layers.0.self_attn.k_proj.weight", {24, 32}},
      {"model.layers.0.self_attn.v_proj.weight", {24, 32}},
      {"model.layers.0.self_attn.o_proj.weight", {32, 32}},
      {"model.layers.0.mlp.gate.weight", {4, 32}},
      {"model.layers.0.mlp.experts.up_proj", {4, 20, 32}},
      {"model.layers.0.mlp.experts.down_proj", {4, 32, 20}},
      {"model.layers.0.input_layernorm.weight", {32}},
      {"lm_head.weight", {40, 32}},
  };
  TrainerConfig config;
  config.optimizer.target = "Muon";
  config.optimizer.fp32_main_params = true;
  config.mix_precision.reduce_dtype = "float32";  // fp32-main-params §2.5
  muon_config(config).options.lr(0.02);
  muon_config(config).options.weight_decay(0.1);
  const int steps = 2;
  auto init = [&](size_t i) { return random_normal(shapes[i].shape, 7 + i).to(at::kBFloat16); };
  auto grad = [&](size_t i, int step) { return random_normal(shapes[i].shape, 500 * step + i); };

  // One process.
  auto full = whole_params(shapes, init);
  auto reference = build_optimizer(full, config);
  for (int step = 1; step <= steps; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      reference->main_grad(shapes[i].name).copy_(grad(i, step));
    }
    reference->step();
    reference->zero_grad();
  }

  const int n = 2;
  auto group = make_thread_group(n);
  std::vector<std::vector<at::Tensor>> model(n), main(n);
  run_ranks(n, [&](int rank) {
    auto [shard, layout] = dim0_shards(shapes, init, rank, n, group[rank]);
    auto built = build_optimizer(shard, config);
    dynamic_cast<MixedPrecisionOptimizer&>(*built).chained().set_placements(layout);
    for (int step = 1; step <= steps; ++step) {
      for (size_t i = 0; i < shapes.size(); ++i) {
        built->main_grad(shapes[i].name).copy_(dim0_chunk(grad(i, step), rank, n));
      }
      built->step();
      built->zero_grad();
    }
    auto& wrapper = dynamic_cast<MixedPrecisionOptimizer&>(*built);
    for (size_t i = 0; i < shapes.size(); ++i) {
      model[rank].push_back(shard[i].second);
      main[rank].push_back(wrapper.main_param(shapes[i].name));
    }
  });
  auto& ref = dynamic_cast<MixedPrecisionOptimizer&>(*reference);
  for (size_t i = 0; i < shapes.size(); ++i) {
    expect_main_param_equal(main, ref, shapes[i].name, i);
    EXPECT_TRUE(bitwise_equal(gather_rows(model, i), full[i].second)) << shapes[i].name;
  }
}

// The trainer's path with muon_per_head (build_optimizer splits q/k/v/o by their roles, heads of
// model.head_dim 8) and telemetry on step 2 over every matrix (sample 1000): two FSDP ranks
// with float32 Newton–Schulz and wire equal one process bitwise, and the telemetry agrees:
//   sampled: every matrix once on either side (4 + 3 + 3 + 4 heads, the gate, 2 x 4 experts);
//   error mean and max: the same O per matrix, errors computed in float32 batches of other
//     sizes and summed in another order: 1e-6 relative;
//   update RMS: against the RMS of the main params' change on the one process, written out
//     (p_before * (1 - lr*wd) - p_after over every Muon param, float64): float32 rounding of
//     p ~ 1 (6e-8) against update elements ~ 1e-3: 1e-4 relative; 2 ranks vs 1: float32 piece
//     sums added in another order, 1e-6 relative.
TEST(DistributedMuonTest, PerHeadStackAndTelemetryOnTwoRanksEqualOneProcess) {
  const std::vector<NamedShape> shapes = {
      {"model.embed_tokens.weight", {40, 32}},
      {"model.layers.0.self_attn.q_proj.weight", {32, 32}},
      {"model.layers.0.self_attn.k_proj.weight", {24, 32}},
      {"model.layers.0.self_attn.v_proj.weight", {24, 32}},
      {"model.layers.0.self_attn.o_proj.weight", {32, 32}},
      {"model.layers.0.mlp.gate.weight", {4, 32}},
      {"model.layers.0.mlp.experts.up_proj", {4, 20, 32}},
      {"model.layers.0.mlp.experts.down_proj", {4, 32, 20}},
      {"lm_head.weight", {40, 32}},
  };
  const std::vector<bool> is_muon = {false, true, true, true, true, true, true, true, false};
  TrainerConfig config;
  config.optimizer.target = "Muon";
  config.optimizer.fp32_main_params = true;
  config.mix_precision.reduce_dtype = "float32";
  muon_config(config).options.lr(0.02);
  muon_config(config).options.weight_decay(0.1);
  muon_config(config).options.ns_dtype(at::kFloat);
  muon_config(config).options.communication_dtype(at::kFloat);
  muon_config(config).per_head = true;
  config.model.head_dim = 8;
  const int64_t all_matrices = 4 + 3 + 3 + 4 + 1 + 4 + 4;
  // What the model declares for its attention projections (core/param_role.h).
  const std::string attn = "model.layers.0.self_attn.";
  const ParamRoles roles = {{shapes[1].name, {ParamRole::kAttentionQuery, attn}},
                            {shapes[2].name, {ParamRole::kAttentionKey, attn}},
                            {shapes[3].name, {ParamRole::kAttentionValue, attn}},
                            {shapes[4].name, {ParamRole::kAttentionOutput, attn}}};
  auto init = [&](size_t i) { return random_normal(shapes[i].shape, 9 + i).to(at::kBFloat16); };
  auto grad = [&](size_t i, int step) { return random_normal(shapes[i].shape, 700 * step + i); };

  auto full = whole_params(shapes, init);
  auto reference = build_optimizer(full, config, roles);
  auto& ref = dynamic_cast<MixedPrecisionOptimizer&>(*reference);
  EXPECT_EQ(dynamic_cast<Muon&>(ref.chained().leaf_of(shapes[4].name))
                .head_split(ref.main_param(shapes[4].name))
                .dim,
            1);
  std::vector<MuonGroupTelemetry> expected;
  double change_squares = 0.0, muon_numel = 0.0;
  for (int step = 1; step <= 2; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      reference->main_grad(shapes[i].name).copy_(grad(i, step));
    }
    std::vector<at::Tensor> before;
    for (const auto& shape : shapes) before.push_back(ref.main_param(shape.name).clone());
    if (step == 2) arm_muon_telemetry(ref.chained(), 1000);
    reference->step();
    reference->zero_grad();
    if (step < 2) continue;
    expected = muon_step_telemetry(ref.chained(), nullptr);
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (!is_muon[i]) continue;
      const at::Tensor change = before[i].to(at::kDouble) * (1 - 0.02 * 0.1) -
                                ref.main_param(shapes[i].name).to(at::kDouble);
      change_squares += (change * change).sum().item<double>();
      muon_numel += static_cast<double>(change.numel());
    }
  }
  ASSERT_EQ(expected.size(), 1u);
  EXPECT_EQ(expected[0].sampled, all_matrices);
  const double change_rms = std::sqrt(change_squares / muon_numel);
  EXPECT_NEAR(expected[0].update_rms, change_rms, 1e-4 * change_rms);

  const int n = 2;
  auto group = make_thread_group(n);
  std::vector<std::vector<at::Tensor>> main(n);
  std::vector<std::vector<MuonGroupTelemetry>> got(n);
  run_ranks(n, [&](int rank) {
    auto [shard, layout] = dim0_shards(shapes, init, rank, n, group[rank]);
    auto built = build_optimizer(shard, config, roles);
    auto& wrapper = dynamic_cast<MixedPrecisionOptimizer&>(*built);
    wrapper.chained().set_placements(layout);
    for (int step = 1; step <= 2; ++step) {
      for (size_t i = 0; i < shapes.size(); ++i) {
        built->main_grad(shapes[i].name).copy_(dim0_chunk(grad(i, step), rank, n));
      }
      if (step == 2) arm_muon_telemetry(wrapper.chained(), 1000);
      built->step();
      built->zero_grad();
    }
    got[rank] = muon_step_telemetry(wrapper.chained(), group[rank].get());
    for (const auto& shape : shapes) main[rank].push_back(wrapper.main_param(shape.name));
  });
  for (size_t i = 0; i < shapes.size(); ++i) {
    expect_main_param_equal(main, ref, shapes[i].name, i);
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(got[r].size(), 1u);
    const MuonGroupTelemetry& t = got[r][0];
    EXPECT_EQ(t.sampled, all_matrices) << "rank " << r;
    EXPECT_NEAR(t.ortho_error_mean, expected[0].ortho_error_mean,
                1e-6 * expected[0].ortho_error_mean);
    EXPECT_NEAR(t.ortho_error_max, expected[0].ortho_error_max, 1e-6 * expected[0].ortho_error_max);
    EXPECT_NEAR(t.update_rms, expected[0].update_rms, 1e-6 * expected[0].update_rms);
  }
}

TEST(DistributedMuonTest, SetMuonShardingRejectsUnknownNames) {
  std::vector<std::pair<std::string, at::Tensor>> params = {
      {"w", at::zeros({4, 4}).requires_grad_(true)}};
  TrainerConfig config;
  config.optimizer.target = "Muon";
  auto built = build_optimizer(params, config);
  auto& chained = dynamic_cast<ChainedOptimizer&>(*built);
  EXPECT_THROW(chained.set_placements({whole_placement("nope", {4, 4})}), std::invalid_argument);
  chained.set_placements({whole_placement("w", {4, 4})});
  EXPECT_EQ(dynamic_cast<Muon&>(chained.leaf_of("w")).sharding(params[0].second).name, "w");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
