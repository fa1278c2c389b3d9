#include "mixtrain/core/op_counter.h"

#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

namespace mixtrain {
namespace {

std::atomic<int64_t> g_ops{0};
std::atomic<int64_t> g_allocations{0};

// By name, copied: a RecordFunction's name may live only as long as the call.
struct Histogram {
  std::mutex mutex;
  std::unordered_map<std::string, int64_t> counts;
};
Histogram& histogram() {
  static Histogram* h = new Histogram();  // never destroyed: callbacks may outlive statics
  return *h;
}

std::unique_ptr<at::ObserverContext> count_op(const at::RecordFunction& fn) {
  // Dispatcher calls only: not the other records of scope FUNCTION (autograd's
  // "evaluate_function: XBackward0" markers, RECORD_FUNCTION blocks).
  if (!fn.operator_name().has_value()) return nullptr;
  g_ops.fetch_add(1, std::memory_order_relaxed);
  Histogram& h = histogram();
  const char* name = fn.name();
  std::string key = name != nullptr && *name != '\0' ? name : "(unnamed)";
  std::lock_guard<std::mutex> lock(h.mutex);
  ++h.counts[std::move(key)];
  return nullptr;
}

// Receives what allocators report to LibTorch's memory profiler on the threads that carry it.
class AllocationCounter final : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, int64_t alloc_size, size_t, size_t, c10::Device) override {
    if (alloc_size > 0) g_allocations.fetch_add(1, std::memory_order_relaxed);
  }
  bool memoryProfilingEnabled() const override { return true; }
};

}  // namespace

OpCounts op_counts() {
  return {g_ops.load(std::memory_order_relaxed), g_allocations.load(std::memory_order_relaxed)};
}

std::vector<std::pair<std::string, int64_t>> most_counted_ops(size_t limit) {
  std::vector<std::pair<std::string, int64_t>> sorted;
  {
    Histogram& h = histogram();
    std::lock_guard<std::mutex> lock(h.mutex);
    sorted.assign(h.counts.begin(), h.counts.end());
  }
  std::sort(sorted.begin(), sorted.end());  // by name, then stably by count
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  if (sorted.size() > limit) sorted.resize(limit);
  return sorted;
}

struct OpCountScope::State {
  at::CallbackHandle callback = 0;
  std::optional<c10::DebugInfoGuard> allocations;
};

OpCountScope::OpCountScope() : state_(std::make_unique<State>()) {
  state_->callback = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&count_op).scopes({at::RecordScope::FUNCTION}).needsInputs(false));
  state_->allocations.emplace(c10::DebugInfoKind::PROFILER_STATE,
                              std::make_shared<AllocationCounter>());
}

OpCountScope::~OpCountScope() {
  state_->allocations.reset();
  at::removeCallback(state_->callback);
}

}  // namespace mixtrain
