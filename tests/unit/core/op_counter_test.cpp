// OpCountScope / op_counts: what is counted (one dispatcher call per ATen op, nested calls
// included; one allocation per buffer from an allocator that reports), where (the scope's
// thread and the autograd work it runs, not other threads) and when (only while a scope lives).
#include "mixtrain/core/op_counter.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <thread>

#include "mixtrain/core/caching_cpu_allocator.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(OpCounterTest, CountsEachDispatchedOpOnlyInsideAScope) {
  const at::Tensor a = at::ones({4}), b = at::ones({4});
  const OpCounts before = op_counts();
  at::Tensor c = at::add(a, b);  // no scope: not counted
  EXPECT_EQ((op_counts() - before).ops, 0);
  {
    OpCountScope scope;
    const OpCounts start = op_counts();
    c = at::add(a, b);  // one dispatcher call: aten::add.Tensor
    EXPECT_EQ((op_counts() - start).ops, 1);
    c.add_(a);    // aten::add_.Tensor
    c.mul_(2.0);  // aten::mul_.Scalar, which calls aten::mul_.Tensor on a wrapped number
    EXPECT_GE((op_counts() - start).ops, 3);
  }
  const OpCounts after = op_counts();
  c = at::add(a, b);
  EXPECT_EQ((op_counts() - after).ops, 0);
}

TEST(OpCounterTest, NestedCallsCountEach) {
  const at::Tensor x = at::randn({8, 16}), w = at::randn({4, 16});
  OpCountScope scope;
  const OpCounts start = op_counts();
  const at::Tensor y = at::linear(x, w);  // linear -> its decomposition (t, matmul/mm or addmm)
  EXPECT_GE((op_counts() - start).ops, 2);
  EXPECT_TRUE(y.defined());
}

TEST(OpCounterTest, AnotherThreadIsNotCounted) {
  const at::Tensor a = at::ones({4});
  OpCountScope scope;
  const OpCounts start = op_counts();
  std::thread other([&] {
    for (int i = 0; i < 10; ++i) at::Tensor t = a + a;
  });
  other.join();
  EXPECT_EQ((op_counts() - start).ops, 0);
}

TEST(OpCounterTest, BackwardOpsAreCountedOnTheScopeThread) {
  const at::Tensor w = at::randn({16}).set_requires_grad(true);
  const at::Tensor loss = (w * w).sum();
  OpCountScope scope;
  const OpCounts start = op_counts();
  loss.backward();  // CPU: autograd runs the graph on this thread
  EXPECT_GT((op_counts() - start).ops, 0);
  EXPECT_TRUE(w.grad().defined());
}

TEST(OpCounterTest, NestedScopesKeepCounting) {
  const at::Tensor a = at::ones({4});
  OpCountScope outer;
  const OpCounts start = op_counts();
  { OpCountScope inner; }
  at::Tensor t = at::add(a, a);
  EXPECT_EQ((op_counts() - start).ops, 1);
}

TEST(OpCounterTest, CountsAllocationsOfReportingAllocators) {
  CachingCpuAllocator caching;  // not installed: called directly
  c10::Allocator* system = c10::GetDefaultCPUAllocator();
  const OpCounts before = op_counts();
  { c10::DataPtr unseen = caching.allocate(1 << 20); }
  EXPECT_EQ((op_counts() - before).allocations, 0);
  OpCountScope scope;
  const OpCounts start = op_counts();
  {
    c10::DataPtr cached_size = caching.allocate(1 << 20);  // a cached class
    c10::DataPtr small = caching.allocate(100);            // passed through
    c10::DataPtr from_system = system->allocate(4096);
  }
  { c10::DataPtr reused = caching.allocate(1 << 20); }  // from the cache: still one request
  EXPECT_EQ((op_counts() - start).allocations, 4);
  EXPECT_EQ((op_counts() - start).ops, 0);  // allocator calls are not ops
}

TEST(OpCounterTest, MostCountedOpsAreByNameMostFirst) {
  const at::Tensor a = at::ones({4});
  {
    OpCountScope scope;
    for (int i = 0; i < 1000; ++i) at::Tensor t = at::sub(a, a);
    at::Tensor t = at::add(a, a);
  }
  const auto top = most_counted_ops(1);
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].first, "aten::sub");  // more than any other test here dispatches of one op
  EXPECT_GE(top[0].second, 1000);
  const auto all = most_counted_ops(1000);
  EXPECT_GE(all.size(), 2u);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_GE(all[i - 1].second, all[i].second);
}

TEST(OpCounterTest, CountsDifferenceAndSum) {
  const OpCounts a{10, 3}, b{4, 1};
  const OpCounts d = a - b;
  EXPECT_EQ(d.ops, 6);
  EXPECT_EQ(d.allocations, 2);
  OpCounts s = d;
  s += b;
  EXPECT_EQ(s.ops, 10);
  EXPECT_EQ(s.allocations, 3);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
