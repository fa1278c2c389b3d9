// A caching allocator for CPU tensor buffers, installed as LibTorch's CPU allocator
// (c10::SetCPUAllocator) by `train.cpu_allocator: caching`, the default.
//
// Why: a training step allocates the same temporaries every time. glibc hands large freed blocks
// back to the kernel (munmap, heap trim), so each step maps them afresh and first-touches every
// page again (bench/README.md, twin_ratio: the cost of that on these machines). This allocator
// keeps freed buffers of at least kMinCachedBytes in free lists per size class and hands them
// out again; smaller requests are allocated and freed at once, as LibTorch's default does.
//
// Size classes: a request is rounded up to a multiple of 1/8 of its power of two (so at most
// 12.5% slack) and of 4 KiB. Bound: the bytes this allocator holds (live + cached) never exceed
// kHeadroom x the highest live byte count seen so far (its peak) unless the live bytes alone do:
// a miss that would cross that line first frees cached blocks, largest class first. Memory
// therefore grows only with the program's own peak, never with the variety of sizes it asks for
// (MoE expert buffers change size every step).
//
// Like c10's allocators it reports each allocation and free to LibTorch's memory profiler when
// one listens on the thread (c10::reportMemoryUsageToProfiler; core/op_counter.h counts them).
//
// Buffers are 64-byte aligned, like LibTorch's. Thread-safe (one mutex; taken only for cached
// sizes). Blocks freed after the allocator stopped being the CPU allocator still come back to it.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace mixtrain {

struct CachingCpuAllocatorStats {
  int64_t hits = 0;          // requests served from the cache
  int64_t misses = 0;        // cached-size requests that needed fresh memory
  int64_t live_bytes = 0;    // handed out and not yet freed (class sizes)
  int64_t cached_bytes = 0;  // freed and kept for reuse
  int64_t peak_live_bytes = 0;
  int64_t released_bytes = 0;  // cached blocks freed to keep the bound
};

class CachingCpuAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kMinCachedBytes = 64 * 1024;
  static constexpr double kHeadroom = 1.25;
  static constexpr double kMaxFitSlack = 1.25;  // a cached block serves requests down to 1/1.25

  CachingCpuAllocator() = default;
  ~CachingCpuAllocator() override;  // frees the cached blocks
  CachingCpuAllocator(const CachingCpuAllocator&) = delete;
  CachingCpuAllocator& operator=(const CachingCpuAllocator&) = delete;

  c10::DataPtr allocate(size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, size_t count) const override;

  CachingCpuAllocatorStats stats() const;
  void release_cached();  // frees every cached block

  // Marks the block behind `data` (a DataPtr this allocator made) to go back to the system when
  // it is freed instead of into the cache: for memory whose contents moved elsewhere for good
  // (the swap optimizer's state, written to its file). false if `data` is not such a block
  // (small blocks and other allocators' memory are freed at once anyway).
  static bool release_to_system_on_free(const c10::DataPtr& data);

  // The size class a request of `bytes` (>= kMinCachedBytes) is served from.
  static size_t size_class(size_t bytes);

  // The process-wide instance `train.cpu_allocator: caching` installs (never destroyed).
  static CachingCpuAllocator& instance();

 private:
  static void delete_block(void* data);
  void give_back(void* base, size_t size, bool to_system);
  void release_locked(size_t needed);

  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;  // class size -> block bases
  CachingCpuAllocatorStats stats_;
};

// One log line: "cpu allocator (caching): 97.2% of 26922 requests >= 64 KiB reused; holds 893.1
// MiB (live 443.6 + cached 449.5), 1.19x its peak of live buffers (750.5 MiB); released 1019.0
// MiB".
std::string format_cpu_allocator_stats(const CachingCpuAllocatorStats& stats);

// Makes CachingCpuAllocator::instance() LibTorch's CPU allocator (idempotent). Call before the
// run's tensors exist; earlier tensors keep and return to their own allocator.
void install_caching_cpu_allocator();

}  // namespace mixtrain
