// Compiled in a CUDA build only (MIXTRAIN_WITH_CUDA): a CPU-only build has no NCCL.
#if MIXTRAIN_WITH_CUDA
#include "mixtrain/distributed/nccl_collectives.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <utility>

#include "mixtrain/core/error.h"
#include "mixtrain/distributed/collective_checks.h"

namespace mixtrain {
NcclGroup::NcclGroup(const c10::intrusive_ptr<c10d::Store>& store, int group_rank, int group_size,
                     c10::Device device, std::chrono::milliseconds timeout)
    : device_(device) {
  if (!device.is_cuda() || !device.has_index()) {
    throw std::invalid_argument("NcclGroup: needs a CUDA device with an index, got " +
                                device.str());
  }
  // Read by the ProcessGroupNCCL constructor: a timed-out collective tears the process down
  // (3 = tear down without ncclCommAbort, which can itself hang) instead of hanging. An
  // explicit setting in the environment wins.
  setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3", /*overwrite=*/0);
  // A non-blocking communicator: ncclCommInitRankConfig returns at once and connect() polls it
  // until it is ready or c10d's non-blocking timeout (whole seconds, read once per process at
  // the first poll) has passed, so a member that never arrives, hangs or dies during the set-up
  // is an error, not a wait in NCCL's bootstrap forever. The same bound applies to later
  // non-blocking launches; the collectives themselves still time out after `timeout`.
  const auto seconds =
      std::max<int64_t>(1, std::chrono::ceil<std::chrono::seconds>(timeout).count());
  setenv("TORCH_NCCL_NONBLOCKING_TIMEOUT", std::to_string(seconds).c_str(), /*overwrite=*/0);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  options->config.blocking = 0;
  auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, group_rank, group_size, options);
  group->setBoundDeviceId(device);
  backend_ = group;
}

NcclGroup::~NcclGroup() {
  if (aborted_) return;  // shutdown() would first wait for the communicator that never came
  try {
    backend_->shutdown();  // else ProcessGroupNCCL's destructor warns that nobody did
  } catch (const std::exception&) {
    // Shutting down after a failure: the failure is what gets reported.
  }
}

void NcclGroup::connect() {
  auto& group = static_cast<c10d::ProcessGroupNCCL&>(*backend_);
  c10::cuda::CUDAGuard guard(device_);  // getCommPtr finds the communicator of the current device
  try {
    group.eagerConnectSingleDevice(device_);  // starts the set-up, does not wait for it
    (void)group.getCommPtr();                 // waits until ready, or throws at the timeout
  } catch (const c10::DistError&) {
    aborted_ = true;
    group.abort();  // ncclCommAbort: NCCL's set-up thread stops waiting for the peers
    throw;
  }
}

NcclCollectives::NcclCollectives(std::shared_ptr<NcclGroup> group, std::string name, int world_rank)
    : group_(std::move(group)),
      name_(std::move(name)),
      rank_(group_->backend().getRank()),
      size_(group_->backend().getSize()),
      world_rank_(world_rank) {}

template <typename Issue>
c10::intrusive_ptr<c10d::Work> NcclCollectives::issue(const char* op, Issue&& start) const {
  try {
    return start(group_->backend());
  } catch (const c10::DistError& error) {  // communicator setup or NCCL errors, not arguments
    throw UserError(name_ + ": " + op + " failed on rank " + std::to_string(world_rank_) + ": " +
                    first_line(error));
  }
}

void NcclCollectives::wait(const c10::intrusive_ptr<c10d::Work>& work, const char* op) const {
  try {
    work->wait();  // the current stream waits for the NCCL stream; the host does not
  } catch (const std::exception& error) {
    throw UserError(name_ + ": " + op + " failed on rank " + std::to_string(world_rank_) + ": " +
                    first_line(error));
  }
}

template <typename Issue>
void NcclCollectives::run(const char* op, Issue&& issue_op) const {
  wait(issue(op, std::forward<Issue>(issue_op)), op);
}

namespace {

// One issued NCCL collective: its Work, the device buffers (kept alive until the current
// stream has waited for it), and where the result goes.
class NcclWork final : public CollectiveWork {
 public:
  using Clock = std::chrono::steady_clock;
  NcclWork(std::function<void(const c10::intrusive_ptr<c10d::Work>&)> wait_fn, std::string what,
           std::shared_ptr<CollectiveCounters> counters, CollectiveOp op, int64_t bytes,
           c10::intrusive_ptr<c10d::Work> work, at::Tensor result, at::Tensor input,
           c10::Device result_device, Clock::duration issue_time)
      : wait_fn_(std::move(wait_fn)),
        what_(std::move(what)),
        counters_(std::move(counters)),
        op_(op),
        bytes_(bytes),
        work_(std::move(work)),
        result_(std::move(result)),
        input_(std::move(input)),
        result_device_(result_device),
        host_time_(issue_time) {}
  ~NcclWork() override {
    if (!work_) return;
    try {
      work_->wait();
    } catch (const std::exception&) {
      // Unwinding from another error, which is the one to report.
    }
  }
  at::Tensor wait() override {
    if (!work_) throw std::logic_error(what_ + " waited twice");
    const auto start = Clock::now();
    auto work = std::move(work_);
    struct Record {
      const NcclWork& self;
      Clock::time_point start;
      ~Record() {
        record_collective(
            self.op_, self.bytes_,
            std::chrono::duration<double>(self.host_time_ + (Clock::now() - start)).count(),
            self.counters_.get());
      }
    } record{*this, start};
    wait_fn_(work);
    input_ = at::Tensor();
    at::Tensor result = std::move(result_);
    return result.device() == result_device_ ? result : result.to(result_device_);
  }

 private:
  std::function<void(const c10::intrusive_ptr<c10d::Work>&)> wait_fn_;
  std::string what_;
  std::shared_ptr<CollectiveCounters> counters_;
  CollectiveOp op_;
  int64_t bytes_;
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor result_;
  at::Tensor input_;
  c10::Device result_device_;
  Clock::duration host_time_;
};

}  // namespace

at::Tensor NcclCollectives::on_device(const at::Tensor& tensor, const char* op) const {
  if (!tensor.defined() || !tensor.is_contiguous()) {
    throw std::invalid_argument(name_ + ": " + op + " needs a defined, contiguous tensor");
  }
  check_payload_dtype(name_, op, tensor.scalar_type());
  const c10::Device device = group_->device();
  if (tensor.device() == device) return tensor;
  if (tensor.device().is_cpu()) return tensor.to(device);
  throw std::invalid_argument(name_ + ": " + op + " got a tensor on " + tensor.device().str() +
                              " but the group is on " + device.str());
}

void NcclCollectives::all_reduce(at::Tensor& tensor, ReduceOp op) {
  const char* what = op == ReduceOp::kSum ? "all_reduce_sum" : "all_reduce_max";
  if (tensor.defined() && tensor.scalar_type() == at::kBFloat16) {
    throw std::invalid_argument(name_ + ": " + what + " of bfloat16 is not offered; reduce " +
                                "in float32");
  }
  at::Tensor reduced = on_device(tensor, what);
  // float16 sums in float32 and rounds once; its max is exact either way.
  if (reduced.scalar_type() == at::kHalf) reduced = reduced.to(at::kFloat);
  // Ring all-reduce: reduce-scatter then all-gather, (n-1)/n of the tensor each.
  const int64_t n = size_;
  CollectiveCallRecord record(*this, CollectiveOp::kAllReduce,
                              2 * (n - 1) * static_cast<int64_t>(reduced.nbytes()) / n);
  std::vector<at::Tensor> tensors = {reduced};
  c10d::AllreduceOptions options;
  options.reduceOp = op == ReduceOp::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;  // ncclMax
  run(what, [&](c10d::Backend& group) { return group.allreduce(tensors, options); });
  if (!reduced.is_same(tensor)) tensor.copy_(reduced);  // back to the host, or float16 once
}

at::Tensor NcclCollectives::all_gather(const at::Tensor& local) {
  return all_gather_async(local)->wait();  // the same call, waited for at once
}

at::Tensor NcclCollectives::reduce_scatter_sum(const at::Tensor& full) {
  at::Tensor input = on_device(full, "reduce_scatter_sum");
  const at::ScalarType type = input.scalar_type();
  // float16 is summed in float32 and rounded once: the float32 bytes go on the wire.
  const int64_t wire_nbytes = static_cast<int64_t>(input.nbytes()) * (type == at::kHalf ? 2 : 1);
  const ReduceScatterShape checked = check_reduce_scatter(name_, size_, input, wire_nbytes);
  if (type == at::kHalf) input = input.to(at::kFloat);
  at::Tensor output = at::empty(checked.result, input.options());
  CollectiveCallRecord record(*this, CollectiveOp::kReduceScatter, checked.sent_bytes);
  if (input.numel() > 0) {
    run("reduce_scatter_sum",
        [&](c10d::Backend& group) { return group._reduce_scatter_base(output, input); });
  }
  return output.to(full.device(), type);
}

at::Tensor NcclCollectives::all_to_all(const at::Tensor& input,
                                       const std::vector<int64_t>& send_counts,
                                       const std::vector<int64_t>& recv_counts) {
  at::Tensor send_buffer = on_device(input, "all_to_all");
  const AllToAllShape checked =
      check_all_to_all(name_, rank_, size_, input, send_counts, recv_counts);
  CollectiveCallRecord record(*this, CollectiveOp::kAllToAll, checked.sent_bytes);
  at::Tensor result = at::empty(checked.result, send_buffer.options());
  std::vector<int64_t> send = send_counts;
  std::vector<int64_t> recv = recv_counts;
  run("all_to_all",
      [&](c10d::Backend& group) { return group.alltoall_base(result, send_buffer, recv, send); });
  return input.device() == result.device() ? result : result.to(input.device());
}

std::unique_ptr<CollectiveWork> NcclCollectives::all_to_all_async(
    const at::Tensor& input, const std::vector<int64_t>& send_counts,
    const std::vector<int64_t>& recv_counts) {
  const auto start = NcclWork::Clock::now();
  at::Tensor send_buffer = on_device(input, "all_to_all");
  const AllToAllShape checked =
      check_all_to_all(name_, rank_, size_, input, send_counts, recv_counts);
  at::Tensor result = at::empty(checked.result, send_buffer.options());
  std::vector<int64_t> send = send_counts;
  std::vector<int64_t> recv = recv_counts;
  auto work = issue("all_to_all", [&](c10d::Backend& group) {
    return group.alltoall_base(result, send_buffer, recv, send);
  });
  return std::make_unique<NcclWork>(
      [this](const c10::intrusive_ptr<c10d::Work>& w) { wait(w, "all_to_all"); },
      name_ + ": all_to_all", counters(), CollectiveOp::kAllToAll, checked.sent_bytes,
      std::move(work), std::move(result), std::move(send_buffer), input.device(),
      NcclWork::Clock::now() - start);
}

std::unique_ptr<CollectiveWork> NcclCollectives::all_gather_async(const at::Tensor& local) {
  const auto start = NcclWork::Clock::now();
  at::Tensor input = on_device(local, "all_gather");
  const AllGatherShape shape = all_gather_shape(input, size_);
  at::Tensor result = at::empty(shape.result, input.options());
  const int64_t bytes = shape.sent_bytes;
  if (result.numel() == 0) {
    record_collective(CollectiveOp::kAllGather, bytes, 0.0, counters().get());
    return finished_collective_work(result.to(local.device()));
  }
  input = input.reshape(shape.block);
  auto work = issue("all_gather",
                    [&](c10d::Backend& group) { return group._allgather_base(result, input); });
  return std::make_unique<NcclWork>(
      [this](const c10::intrusive_ptr<c10d::Work>& w) { wait(w, "all_gather"); },
      name_ + ": all_gather", counters(), CollectiveOp::kAllGather, bytes, std::move(work),
      std::move(result), std::move(input), local.device(), NcclWork::Clock::now() - start);
}

void NcclCollectives::broadcast(at::Tensor& tensor, int root) {
  at::Tensor data = on_device(tensor, "broadcast");
  CollectiveCallRecord record(
      *this, CollectiveOp::kBroadcast,
      check_broadcast(name_, rank_, size_, root, static_cast<int64_t>(data.nbytes())));
  std::vector<at::Tensor> tensors = {data};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  run("broadcast", [&](c10d::Backend& group) { return group.broadcast(tensors, options); });
  if (!data.is_same(tensor)) tensor.copy_(data);
}

void NcclCollectives::barrier() {
  CollectiveCallRecord record(*this, CollectiveOp::kBarrier, 0);
  const c10::Device device = group_->device();
  std::vector<at::Tensor> token = {at::zeros({1}, at::TensorOptions().device(device))};
  run("barrier", [&](c10d::Backend& group) { return group.allreduce(token); });
  // The host waits until the all-reduce (and so every rank's arrival) is done.
  c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
}

}  // namespace mixtrain
#endif  // MIXTRAIN_WITH_CUDA
