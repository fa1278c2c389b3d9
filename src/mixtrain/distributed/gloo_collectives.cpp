#include "mixtrain/distributed/gloo_collectives.h"

#include <ATen/ATen.h>

#include <chrono>
#include <stdexcept>
#include <utility>

#include "mixtrain/core/error.h"
#include "mixtrain/distributed/collective_checks.h"

namespace mixtrain {
GlooCollectives::GlooCollectives(c10::intrusive_ptr<c10d::ProcessGroupGloo> group, std::string name,
                                 int world_rank)
    : group_(std::move(group)),
      name_(std::move(name)),
      rank_(group_->getRank()),
      size_(group_->getSize()),
      world_rank_(world_rank) {}

void GlooCollectives::wait(const c10::intrusive_ptr<c10d::Work>& work, const char* op) const {
  try {
    work->wait();
  } catch (const std::exception& error) {
    // The reason: "Connection closed by peer ...", "Timed out waiting 3000ms for recv ...".
    throw UserError(name_ + ": " + op + " failed on rank " + std::to_string(world_rank_) + ": " +
                    first_line(error));
  }
}

namespace {

// One started Gloo collective: the c10d Work, the buffers it reads and writes (kept alive
// until it is done), and what the counters record when it is waited for.
class GlooWork final : public CollectiveWork {
 public:
  using Clock = std::chrono::steady_clock;
  GlooWork(const GlooCollectives& group, const char* op_name, CollectiveOp op, int64_t bytes,
           c10::intrusive_ptr<c10d::Work> work, at::Tensor result, at::Tensor input,
           Clock::duration issue_time)
      : group_(group),
        op_name_(op_name),
        op_(op),
        bytes_(bytes),
        work_(std::move(work)),
        result_(std::move(result)),
        input_(std::move(input)),
        host_time_(issue_time) {}
  ~GlooWork() override {
    if (!work_) return;
    try {
      work_->wait();
    } catch (const std::exception&) {
      // Unwinding from another error, which is the one to report.
    }
  }
  at::Tensor wait() override {
    if (!work_) throw std::logic_error(group_.name() + ": " + op_name_ + " waited twice");
    const auto start = Clock::now();
    auto work = std::move(work_);
    try {
      group_.wait(work, op_name_);
    } catch (...) {
      record(Clock::now() - start);
      throw;
    }
    record(Clock::now() - start);
    input_ = at::Tensor();
    return std::move(result_);
  }

 private:
  void record(Clock::duration waited) const {
    record_collective(op_, bytes_, std::chrono::duration<double>(host_time_ + waited).count(),
                      group_.counters().get());
  }

  const GlooCollectives& group_;
  const char* op_name_;
  CollectiveOp op_;
  int64_t bytes_;
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor result_;
  at::Tensor input_;
  Clock::duration host_time_;
};

}  // namespace

void GlooCollectives::check_input(const at::Tensor& tensor, const char* op) const {
  if (!tensor.defined() || !tensor.device().is_cpu() || !tensor.is_contiguous()) {
    throw std::invalid_argument(name_ + ": " + op + " needs a defined, contiguous CPU tensor");
  }
  check_payload_dtype(name_, op, tensor.scalar_type());
}

void GlooCollectives::all_reduce(at::Tensor& tensor, ReduceOp op) {
  const char* what = op == ReduceOp::kSum ? "all_reduce_sum" : "all_reduce_max";
  check_input(tensor, what);
  if (tensor.scalar_type() == at::kBFloat16) {
    // Gloo would sum in bfloat16, rounding every partial sum: reductions are float32 here.
    throw std::invalid_argument(name_ + ": " + what + " of bfloat16 is not offered; reduce " +
                                "in float32");
  }
  // Ring all-reduce: reduce-scatter then all-gather, (n-1)/n of the tensor each.
  const int64_t n = size_;
  CollectiveCallRecord record(*this, CollectiveOp::kAllReduce,
                              2 * (n - 1) * static_cast<int64_t>(tensor.nbytes()) / n);
  std::vector<at::Tensor> tensors = {tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = op == ReduceOp::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  wait(group_->allreduce(tensors, options), what);
}

at::Tensor GlooCollectives::all_gather(const at::Tensor& local) {
  return all_gather_async(local)->wait();  // the same call, waited for at once
}

at::Tensor GlooCollectives::reduce_scatter_sum(const at::Tensor& full) {
  check_input(full, "reduce_scatter_sum");
  const at::ScalarType type = full.scalar_type();
  const ReduceScatterShape checked =
      check_reduce_scatter(name_, size_, full, static_cast<int64_t>(full.nbytes()));
  const int64_t rows = checked.rows;
  CollectiveCallRecord record(*this, CollectiveOp::kReduceScatter, checked.sent_bytes);
  if (full.numel() == 0) return at::empty_like(full).narrow(0, 0, rows).contiguous();
  // Equal-split alltoall: block j of `received` is rank j's chunk rank(); the same bytes on the
  // wire as a ring reduce-scatter.
  at::Tensor received = at::empty_like(full);
  at::Tensor input = full;
  std::vector<int64_t> equal_splits;  // empty: equal splits
  wait(group_->alltoall_base(received, input, equal_splits, equal_splits), "reduce_scatter_sum");
  // Sum in rank order, so every rank and the single-process reference (r0 + r1 + ...) agree
  // bit for bit; float16 accumulates in float32 and rounds once.
  const bool widen = type == at::kHalf;
  at::Tensor sum = received.narrow(0, 0, rows)
                       .to(widen ? at::kFloat : type, /*non_blocking=*/false,
                           /*copy=*/true);
  for (int r = 1; r < size_; ++r) sum.add_(received.narrow(0, r * rows, rows));
  return widen ? sum.to(type) : sum;
}

at::Tensor GlooCollectives::all_to_all(const at::Tensor& input,
                                       const std::vector<int64_t>& send_counts,
                                       const std::vector<int64_t>& recv_counts) {
  check_input(input, "all_to_all");
  const AllToAllShape checked =
      check_all_to_all(name_, rank_, size_, input, send_counts, recv_counts);
  CollectiveCallRecord record(*this, CollectiveOp::kAllToAll, checked.sent_bytes);
  at::Tensor result = at::empty(checked.result, input.options());
  at::Tensor send_buffer = input;
  std::vector<int64_t> send = send_counts;
  std::vector<int64_t> recv = recv_counts;
  wait(group_->alltoall_base(result, send_buffer, recv, send), "all_to_all");
  return result;
}

std::unique_ptr<CollectiveWork> GlooCollectives::all_to_all_async(
    const at::Tensor& input, const std::vector<int64_t>& send_counts,
    const std::vector<int64_t>& recv_counts) {
  const auto start = GlooWork::Clock::now();
  check_input(input, "all_to_all");
  const AllToAllShape checked =
      check_all_to_all(name_, rank_, size_, input, send_counts, recv_counts);
  at::Tensor result = at::empty(checked.result, input.options());
  at::Tensor send_buffer = input;
  std::vector<int64_t> send = send_counts;
  std::vector<int64_t> recv = recv_counts;
  auto work = group_->alltoall_base(result, send_buffer, recv, send);
  return std::make_unique<GlooWork>(*this, "all_to_all", CollectiveOp::kAllToAll,
                                    checked.sent_bytes, std::move(work), std::move(result), input,
                                    GlooWork::Clock::now() - start);
}

std::unique_ptr<CollectiveWork> GlooCollectives::all_gather_async(const at::Tensor& local) {
  const auto start = GlooWork::Clock::now();
  check_input(local, "all_gather");
  const AllGatherShape shape = all_gather_shape(local, size_);
  at::Tensor result = at::empty(shape.result, local.options());
  const int64_t bytes = shape.sent_bytes;
  if (result.numel() == 0) {
    record_collective(CollectiveOp::kAllGather, bytes, 0.0, counters().get());
    return finished_collective_work(result);
  }
  at::Tensor input = local.reshape(shape.block);
  auto work = group_->_allgather_base(result, input);
  return std::make_unique<GlooWork>(*this, "all_gather", CollectiveOp::kAllGather, bytes,
                                    std::move(work), std::move(result), input,
                                    GlooWork::Clock::now() - start);
}

void GlooCollectives::broadcast(at::Tensor& tensor, int root) {
  check_input(tensor, "broadcast");
  CollectiveCallRecord record(
      *this, CollectiveOp::kBroadcast,
      check_broadcast(name_, rank_, size_, root, static_cast<int64_t>(tensor.nbytes())));
  std::vector<at::Tensor> tensors = {tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  wait(group_->broadcast(tensors, options), "broadcast");
}

void GlooCollectives::barrier() {
  CollectiveCallRecord record(*this, CollectiveOp::kBarrier, 0);
  wait(group_->barrier(), "barrier");
}

}  // namespace mixtrain
