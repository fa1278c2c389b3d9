#include "mixtrain/core/collectives.h"

#include <ATen/ATen.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace mixtrain {
namespace {

// The process counters (behind a mutex: a collective costs far more than taking it) and the
// calling thread's.
std::mutex& process_stats_mutex() {
  static std::mutex mutex;
  return mutex;
}
CollectiveStats& process_stats() {
  static CollectiveStats stats;
  return stats;
}
CollectiveStats& thread_stats() {
  thread_local CollectiveStats stats;
  return stats;
}

void add(CollectiveOpStats& into, int64_t bytes, double seconds) {
  into.calls += 1;
  into.bytes += bytes;
  into.seconds += seconds;
}

// Counts every call with 0 bytes: nothing leaves the process.
class LocalCollectives final : public Collectives {
 public:
  explicit LocalCollectives(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  void all_reduce(at::Tensor&, ReduceOp) override {
    CollectiveCallRecord record(*this, CollectiveOp::kAllReduce, 0);
  }
  at::Tensor all_gather(const at::Tensor& local) override {
    CollectiveCallRecord record(*this, CollectiveOp::kAllGather, 0);
    return local.clone();
  }
  at::Tensor reduce_scatter_sum(const at::Tensor& full) override {
    CollectiveCallRecord record(*this, CollectiveOp::kReduceScatter, 0);
    return full.clone();
  }
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts) override {
    if (send_counts.size() != 1 || recv_counts.size() != 1 || send_counts[0] != recv_counts[0] ||
        send_counts[0] != input.size(0)) {
      throw std::invalid_argument(name_ + ": all_to_all on one rank must send every row to itself");
    }
    CollectiveCallRecord record(*this, CollectiveOp::kAllToAll, 0);
    return input.clone();
  }
  void broadcast(at::Tensor&, int root) override {
    if (root != 0) throw std::invalid_argument(name_ + ": broadcast root out of range");
    CollectiveCallRecord record(*this, CollectiveOp::kBroadcast, 0);
  }
  void barrier() override { CollectiveCallRecord record(*this, CollectiveOp::kBarrier, 0); }

 private:
  std::string name_;
};

}  // namespace

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return "all_reduce";
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kAllToAll:
      return "all_to_all";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kBarrier:
      return "barrier";
  }
  throw std::logic_error("collective_op_name: bad enum value");
}

CollectiveOpStats CollectiveStats::total() const {
  CollectiveOpStats sum;
  for (const CollectiveOpStats& op : ops) {
    sum.calls += op.calls;
    sum.bytes += op.bytes;
    sum.seconds += op.seconds;
  }
  return sum;
}

CollectiveStats CollectiveStats::operator-(const CollectiveStats& earlier) const {
  CollectiveStats diff;
  for (size_t i = 0; i < kCollectiveOpCount; ++i) {
    diff.ops[i].calls = ops[i].calls - earlier.ops[i].calls;
    diff.ops[i].bytes = ops[i].bytes - earlier.ops[i].bytes;
    diff.ops[i].seconds = ops[i].seconds - earlier.ops[i].seconds;
  }
  return diff;
}

CollectiveStats collective_stats() {
  std::lock_guard<std::mutex> lock(process_stats_mutex());
  return process_stats();
}

CollectiveStats thread_collective_stats() {
  return thread_stats();
}

void reset_collective_stats() {
  {
    std::lock_guard<std::mutex> lock(process_stats_mutex());
    process_stats() = CollectiveStats{};
  }
  thread_stats() = CollectiveStats{};
}

CollectiveStats CollectiveCounters::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CollectiveCounters::add(CollectiveOp op, int64_t bytes, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ::mixtrain::add(stats_[op], bytes, seconds);
}

void record_collective(CollectiveOp op, int64_t bytes, double seconds, CollectiveCounters* group) {
  add(thread_stats()[op], bytes, seconds);
  if (group != nullptr) group->add(op, bytes, seconds);
  std::lock_guard<std::mutex> lock(process_stats_mutex());
  add(process_stats()[op], bytes, seconds);
}

namespace {
class FinishedWork final : public CollectiveWork {
 public:
  explicit FinishedWork(at::Tensor result) : result_(std::move(result)) {}
  at::Tensor wait() override { return result_; }

 private:
  at::Tensor result_;
};
}  // namespace

std::unique_ptr<CollectiveWork> finished_collective_work(at::Tensor result) {
  return std::make_unique<FinishedWork>(std::move(result));
}

std::unique_ptr<CollectiveWork> Collectives::all_to_all_async(
    const at::Tensor& input, const std::vector<int64_t>& send_counts,
    const std::vector<int64_t>& recv_counts) {
  return finished_collective_work(all_to_all(input, send_counts, recv_counts));
}

std::unique_ptr<CollectiveWork> Collectives::all_gather_async(const at::Tensor& local) {
  return finished_collective_work(all_gather(local));
}

std::unique_ptr<Collectives> make_local_collectives(const std::string& name) {
  return std::make_unique<LocalCollectives>(name);
}

std::vector<std::string> all_gather_strings(Collectives& group, const std::string& text) {
  if (group.size() == 1) return {text};
  const at::Tensor lengths =
      group.all_gather(at::full({1}, static_cast<int64_t>(text.size()), at::kLong));
  const int64_t* length = lengths.data_ptr<int64_t>();
  int64_t longest = 1;
  for (int r = 0; r < group.size(); ++r) longest = std::max(longest, length[r]);
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::memcpy(padded.data_ptr<uint8_t>(), text.data(), text.size());
  const at::Tensor gathered = group.all_gather(padded);
  std::vector<std::string> texts;
  for (int r = 0; r < group.size(); ++r) {
    const auto* bytes = reinterpret_cast<const char*>(gathered.data_ptr<uint8_t>()) + r * longest;
    texts.emplace_back(bytes, static_cast<size_t>(length[r]));
  }
  return texts;
}

}  // namespace mixtrain
