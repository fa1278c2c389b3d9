// What a training step costs in operations (train.count_ops; docs/architecture.md §3): the
// ATen operators dispatched and the tensor buffers allocated.
//
// - ops: every call through LibTorch's dispatcher (at::RecordFunction, scope FUNCTION), nested
//   calls included (at::linear calling at::matmul calling at::mm is three): each pays the
//   dispatcher's per-op cost, and on a device each is at most one kernel launch plus its host
//   work. Autograd's backward nodes are not ops themselves; the ops they run are.
// - allocations: every buffer an allocator that reports to LibTorch's memory profiler hands out
//   (c10::reportMemoryUsageToProfiler: the caching CPU allocator, LibTorch's CPU and CUDA
//   allocators), cached or not.
//
// Counting is per thread and scoped: an OpCountScope turns it on for the thread that creates it
// and for the threads LibTorch hands that thread's work to (autograd's device threads,
// at::launch), which inherit its thread-local state; other threads (a data prefetcher, an
// async checkpoint writer) are not counted. The counts are process-wide totals, read as
// differences (OpCounts::operator-). While a scope is active every op pays a callback (an
// atomic add and a count by name under a lock): step times measured with counting on are not
// the engine's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain {

struct OpCounts {
  int64_t ops = 0;
  int64_t allocations = 0;

  OpCounts operator-(const OpCounts& earlier) const {
    return {ops - earlier.ops, allocations - earlier.allocations};
  }
  OpCounts& operator+=(const OpCounts& other) {
    ops += other.ops;
    allocations += other.allocations;
    return *this;
  }
};

// The totals counted so far by every scope (zero before the first).
OpCounts op_counts();

// The ops counted so far by name ("aten::add", overloads together), most frequent first (ties
// by name), at most `limit` of them: where a step's count comes from.
std::vector<std::pair<std::string, int64_t>> most_counted_ops(size_t limit);

// Counts while it lives, on the creating thread and the threads that inherit its state. Scopes
// may nest (inner ones end first); they are not copied or moved, and a scope ends on the thread
// that created it.
class OpCountScope {
 public:
  OpCountScope();
  ~OpCountScope();
  OpCountScope(const OpCountScope&) = delete;
  OpCountScope& operator=(const OpCountScope&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mixtrain
