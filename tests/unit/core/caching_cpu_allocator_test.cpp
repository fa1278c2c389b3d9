// CachingCpuAllocator: size classes (by hand), reuse, the pass-through of small requests, the
// bound on held memory under a varying mix of sizes, alignment, and installation as LibTorch's
// CPU allocator.
#include "mixtrain/core/caching_cpu_allocator.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * kKiB;

TEST(CachingCpuAllocatorTest, SizeClassesAreEighthsOfAPowerOfTwo) {
  // 64 KiB: power of two 64 KiB, step max(4 KiB, 8 KiB) = 8 KiB.
  EXPECT_EQ(CachingCpuAllocator::size_class(64 * kKiB), 64 * kKiB);
  EXPECT_EQ(CachingCpuAllocator::size_class(64 * kKiB + 1), 72 * kKiB);
  // 100000 B: power of two 65536, step 8192: ceil(100000 / 8192) = 13 -> 106496.
  EXPECT_EQ(CachingCpuAllocator::size_class(100000), 106496u);
  // Just over 1 MiB: step 128 KiB.
  EXPECT_EQ(CachingCpuAllocator::size_class(kMiB + 1), kMiB + 128 * kKiB);
  EXPECT_EQ(CachingCpuAllocator::size_class(2 * kMiB - 1), 2 * kMiB);
  // Every class holds the request with at most 1/8 of it (or a page) spare.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) {
    const size_t bytes = 64 * kKiB + rng() % (512 * kMiB);
    const size_t size = CachingCpuAllocator::size_class(bytes);
    ASSERT_GE(size, bytes);
    ASSERT_LE(size - bytes, std::max<size_t>(4096, bytes / 8));
    ASSERT_EQ(size % 4096, 0u);
  }
}

TEST(CachingCpuAllocatorTest, FreedBlocksAreReused) {
  CachingCpuAllocator allocator;
  void* first = nullptr;
  {
    c10::DataPtr a = allocator.allocate(kMiB);
    first = a.get();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    EXPECT_EQ(allocator.stats().live_bytes, static_cast<int64_t>(kMiB));
  }
  EXPECT_EQ(allocator.stats().live_bytes, 0);
  EXPECT_EQ(allocator.stats().cached_bytes, static_cast<int64_t>(kMiB));
  // Same class (1 MiB - 100 rounds up to 1 MiB): the same block comes back.
  c10::DataPtr again = allocator.allocate(kMiB - 100);
  EXPECT_EQ(again.get(), first);
  const CachingCpuAllocatorStats stats = allocator.stats();
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 1);
  EXPECT_EQ(stats.cached_bytes, 0);
  // Another class does not take it.
  c10::DataPtr other = allocator.allocate(2 * kMiB);
  EXPECT_NE(other.get(), first);
  EXPECT_EQ(allocator.stats().misses, 2);
}

// ATen calls raw_allocate / raw_deallocate, which need context == data and a raw deleter.
TEST(CachingCpuAllocatorTest, RawAllocateRoundTrips) {
  CachingCpuAllocator allocator;
  for (size_t bytes : {size_t{100}, 3 * kMiB}) {
    void* p = allocator.raw_allocate(bytes);
    ASSERT_NE(p, nullptr);
    std::memset(p, 1, bytes);
    allocator.raw_deallocate(p);
  }
  EXPECT_EQ(allocator.stats().cached_bytes, static_cast<int64_t>(3 * kMiB));
  EXPECT_EQ(allocator.stats().live_bytes, 0);
}

TEST(CachingCpuAllocatorTest, BlocksMarkedForTheSystemAreNotCached) {
  CachingCpuAllocator allocator;
  {
    c10::DataPtr a = allocator.allocate(kMiB);
    EXPECT_TRUE(CachingCpuAllocator::release_to_system_on_free(a));
  }
  CachingCpuAllocatorStats s = allocator.stats();
  EXPECT_EQ(s.live_bytes, 0);
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.released_bytes, static_cast<int64_t>(kMiB));
  // A block taken from the cache again is cached as usual (the mark does not stick).
  { c10::DataPtr b = allocator.allocate(kMiB); }
  { c10::DataPtr c = allocator.allocate(kMiB); }
  EXPECT_EQ(allocator.stats().cached_bytes, static_cast<int64_t>(kMiB));
  EXPECT_EQ(allocator.stats().hits, 1);
  // Not ours: small blocks and other allocators' memory.
  c10::DataPtr small = allocator.allocate(100);
  EXPECT_FALSE(CachingCpuAllocator::release_to_system_on_free(small));
  c10::DataPtr other = c10::GetDefaultCPUAllocator()->allocate(kMiB);
  EXPECT_FALSE(CachingCpuAllocator::release_to_system_on_free(other));
}

TEST(CachingCpuAllocatorTest, SmallRequestsPassThrough) {
  CachingCpuAllocator allocator;
  { c10::DataPtr small = allocator.allocate(CachingCpuAllocator::kMinCachedBytes - 1); }
  const CachingCpuAllocatorStats stats = allocator.stats();
  EXPECT_EQ(stats.hits + stats.misses, 0);
  EXPECT_EQ(stats.cached_bytes, 0);
}

// Steps whose buffers change size every time (as MoE expert buffers do): the memory held stays
// within the headroom of the peak of live bytes, however many classes the sizes touch.
TEST(CachingCpuAllocatorTest, HeldMemoryStaysWithinTheHeadroomOfThePeak) {
  CachingCpuAllocator allocator;
  std::mt19937_64 rng(11);
  for (int step = 0; step < 200; ++step) {
    std::vector<c10::DataPtr> live;
    for (int k = 0; k < 8; ++k) {
      live.push_back(allocator.allocate(64 * kKiB + rng() % (4 * kMiB)));
      const CachingCpuAllocatorStats s = allocator.stats();
      ASSERT_LE(static_cast<double>(s.live_bytes + s.cached_bytes),
                CachingCpuAllocator::kHeadroom * static_cast<double>(s.peak_live_bytes) + 1.0)
          << "step " << step;
    }
  }
  const CachingCpuAllocatorStats s = allocator.stats();
  EXPECT_GT(s.released_bytes, 0);  // the bound really was enforced
  EXPECT_GT(s.hits, 0);
  allocator.release_cached();
  EXPECT_EQ(allocator.stats().cached_bytes, 0);
}

TEST(CachingCpuAllocatorTest, StatsLine) {
  CachingCpuAllocatorStats stats;
  stats.hits = 3;
  stats.misses = 1;
  stats.live_bytes = 2 * kMiB;
  stats.cached_bytes = kMiB;
  stats.peak_live_bytes = 2 * kMiB;
  stats.released_bytes = kMiB / 2;
  // 3 of 4 reused; held 3 MiB = 1.50x the 2 MiB peak.
  EXPECT_EQ(format_cpu_allocator_stats(stats),
            "cpu allocator (caching): 75.0% of 4 requests >= 64 KiB reused; holds 3.0 MiB (live "
            "2.0 + cached 1.0), 1.50x its peak of live buffers (2.0 MiB); released 0.5 MiB");
}

TEST(CachingCpuAllocatorTest, InstalledItServesLibTorchTensors) {
  install_caching_cpu_allocator();
  install_caching_cpu_allocator();  // idempotent
  EXPECT_EQ(c10::GetCPUAllocator(), &CachingCpuAllocator::instance());
  const CachingCpuAllocatorStats before = CachingCpuAllocator::instance().stats();
  void* data = nullptr;
  {
    at::Tensor t = at::ones({1 << 18}, at::kFloat);  // 1 MiB
    data = t.data_ptr();
    EXPECT_EQ(t.sum().item<float>(), static_cast<float>(1 << 18));
  }
  at::Tensor again = at::empty({1 << 18}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), data);
  const CachingCpuAllocatorStats after = CachingCpuAllocator::instance().stats();
  EXPECT_GE(after.hits - before.hits, 1);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
