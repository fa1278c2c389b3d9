#include "mixtrain/core/caching_cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <cstdio>

namespace mixtrain {
namespace {

// Every block starts with this header; the tensor's data follows it at +kHeaderBytes, which
// keeps LibTorch's 64-byte alignment.
struct BlockHeader {
  CachingCpuAllocator* owner;  // null: a small block, freed at once
  size_t size;                 // the class size (the data bytes)
  bool to_system;              // freed to the system, not cached (release_to_system_on_free)
};
constexpr size_t kHeaderBytes = 64;
static_assert(sizeof(BlockHeader) <= kHeaderBytes);

constexpr size_t kPage = 4096;

// LibTorch's memory-profiler protocol (what c10's own allocators do): each allocation and free,
// with the bytes this allocator then holds, to whoever listens on this thread (core/op_counter.h
// counts allocations this way). The totals are the cached classes' (small blocks are not held).
void report_to_profiler(void* data, int64_t bytes, const CachingCpuAllocatorStats& stats) {
  c10::reportMemoryUsageToProfiler(data, bytes, static_cast<size_t>(stats.live_bytes),
                                   static_cast<size_t>(stats.live_bytes + stats.cached_bytes),
                                   c10::Device(c10::DeviceType::CPU));
}

}  // namespace

size_t CachingCpuAllocator::size_class(size_t bytes) {
  // 1/8 of the largest power of two <= bytes, and at least a page.
  size_t floor_pow2 = 1;
  while (floor_pow2 <= bytes / 2) floor_pow2 *= 2;
  const size_t step = std::max(kPage, floor_pow2 / 8);
  return (bytes + step - 1) / step * step;
}

CachingCpuAllocator::~CachingCpuAllocator() {
  release_cached();
}

c10::DataPtr CachingCpuAllocator::allocate(size_t bytes) {
  const bool cached = bytes >= kMinCachedBytes;
  size_t size = cached ? size_class(bytes) : bytes;
  void* base = nullptr;
  if (cached) {
    std::lock_guard<std::mutex> lock(mutex_);
    // Best fit among the classes up to kMaxFitSlack above the request's own (MoE buffers
    // change size a little every step).
    auto found = free_.lower_bound(size);
    while (found != free_.end() && found->second.empty()) ++found;
    if (found != free_.end() &&
        static_cast<double>(found->first) <= kMaxFitSlack * static_cast<double>(size)) {
      size = found->first;
      base = found->second.back();
      found->second.pop_back();
      stats_.cached_bytes -= static_cast<int64_t>(size);
      ++stats_.hits;
    } else {
      ++stats_.misses;
      release_locked(size);
    }
    stats_.live_bytes += static_cast<int64_t>(size);
    stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
  }
  if (base == nullptr) {
    try {
      base = c10::alloc_cpu(size + kHeaderBytes);  // throws c10::Error when out of memory
    } catch (...) {
      if (cached) {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.live_bytes -= static_cast<int64_t>(size);
      }
      throw;
    }
    *static_cast<BlockHeader*>(base) = BlockHeader{cached ? this : nullptr, size, false};
  }
  // Context == data, as c10::Allocator::raw_deallocate requires (ATen uses raw_allocate).
  static_cast<BlockHeader*>(base)->to_system = false;
  void* data = static_cast<char*>(base) + kHeaderBytes;
  if (c10::memoryProfilingEnabled()) {
    report_to_profiler(data, static_cast<int64_t>(size),
                       cached ? stats() : CachingCpuAllocatorStats{});
  }
  return {data, data, &CachingCpuAllocator::delete_block, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr CachingCpuAllocator::raw_deleter() const {
  return &CachingCpuAllocator::delete_block;
}

// Frees cached blocks, largest class first, until live + cached + `needed` fits the bound.
void CachingCpuAllocator::release_locked(size_t needed) {
  const int64_t peak =
      std::max(stats_.peak_live_bytes, stats_.live_bytes + static_cast<int64_t>(needed));
  const auto limit = static_cast<int64_t>(kHeadroom * static_cast<double>(peak));
  for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
    auto& blocks = it->second;
    while (!blocks.empty() &&
           stats_.live_bytes + stats_.cached_bytes + static_cast<int64_t>(needed) > limit) {
      c10::free_cpu(blocks.back());
      blocks.pop_back();
      stats_.cached_bytes -= static_cast<int64_t>(it->first);
      stats_.released_bytes += static_cast<int64_t>(it->first);
    }
  }
}

void CachingCpuAllocator::delete_block(void* data) {
  void* base = static_cast<char*>(data) - kHeaderBytes;
  const BlockHeader header = *static_cast<BlockHeader*>(base);
  if (c10::memoryProfilingEnabled()) {
    report_to_profiler(
        data, -static_cast<int64_t>(header.size),
        header.owner != nullptr ? header.owner->stats() : CachingCpuAllocatorStats{});
  }
  if (header.owner == nullptr) {
    c10::free_cpu(base);  // below kMinCachedBytes: never cached
  } else {
    header.owner->give_back(base, header.size, header.to_system);
  }
}

bool CachingCpuAllocator::release_to_system_on_free(const c10::DataPtr& data) {
  if (data.get_deleter() != &CachingCpuAllocator::delete_block || data.get() == nullptr) {
    return false;
  }
  auto* header =
      static_cast<BlockHeader*>(static_cast<void*>(static_cast<char*>(data.get()) - kHeaderBytes));
  if (header->owner == nullptr) return false;  // small: freed at once anyway
  header->to_system = true;
  return true;
}

void CachingCpuAllocator::give_back(void* base, size_t size, bool to_system) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.live_bytes -= static_cast<int64_t>(size);
    if (!to_system) {
      free_[size].push_back(base);
      stats_.cached_bytes += static_cast<int64_t>(size);
      return;
    }
    stats_.released_bytes += static_cast<int64_t>(size);
  }
  c10::free_cpu(base);
}

void CachingCpuAllocator::copy_data(void* dest, const void* src, size_t count) const {
  default_copy_data(dest, src, count);
}

CachingCpuAllocatorStats CachingCpuAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingCpuAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [size, blocks] : free_) {
    for (void* base : blocks) c10::free_cpu(base);
    stats_.released_bytes += static_cast<int64_t>(size * blocks.size());
    stats_.cached_bytes -= static_cast<int64_t>(size * blocks.size());
    blocks.clear();
  }
}

CachingCpuAllocator& CachingCpuAllocator::instance() {
  static CachingCpuAllocator* allocator = new CachingCpuAllocator();  // outlives every tensor
  return *allocator;
}

std::string format_cpu_allocator_stats(const CachingCpuAllocatorStats& stats) {
  auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); };
  const int64_t requests = stats.hits + stats.misses;
  const int64_t held = stats.live_bytes + stats.cached_bytes;
  char line[320];
  std::snprintf(
      line, sizeof(line),
      "cpu allocator (caching): %.1f%% of %lld requests >= %zu KiB reused; holds %.1f "
      "MiB (live %.1f + cached %.1f), %.2fx its peak of live buffers (%.1f MiB); released "
      "%.1f MiB",
      requests > 0 ? 100.0 * static_cast<double>(stats.hits) / requests : 0.0,
      static_cast<long long>(requests), CachingCpuAllocator::kMinCachedBytes / 1024, mib(held),
      mib(stats.live_bytes), mib(stats.cached_bytes),
      stats.peak_live_bytes > 0
          ? static_cast<double>(held) / static_cast<double>(stats.peak_live_bytes)
          : 0.0,
      mib(stats.peak_live_bytes), mib(stats.released_bytes));
  return line;
}

void install_caching_cpu_allocator() {
  // Priority above LibTorch's default registration (0), so nothing later silently replaces it.
  c10::SetCPUAllocator(&CachingCpuAllocator::instance(), /*priority=*/1);
}

}  // namespace mixtrain
