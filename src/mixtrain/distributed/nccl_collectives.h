// Collectives over a c10d::ProcessGroupNCCL, for ranks on CUDA devices (docs/architecture.md §7).
//
// Same contract as gloo_collectives.h (core/collectives.h: ops, dtypes, counters, errors),
// except where stated here:
// - Tensors live on the group's device (cuda:<LOCAL_RANK>). A CPU tensor (a host value: a count,
//   a flag) is copied to the device and the result back; the host then waits for it. A tensor
//   on another CUDA device is refused.
// - Stream order, not host order: NCCL runs on its own stream; each call makes the calling
//   thread's current stream wait for the collective (Work::wait) and returns without blocking
//   the host, so results may be used by later work on that stream at once, while a host read
//   (.item(), .cpu()) is what synchronises. barrier() alone blocks the host (a barrier that did
//   not would order nothing the host does). So the counters' seconds are host time inside the
//   call: issuing the collective (plus the copies of a host tensor), not its transfer time.
// - reduce_scatter_sum is NCCL's reduce-scatter: its summation order (ring or tree, chosen by
//   NCCL) is not Gloo's rank-order sum, so multi-rank GPU results are not bitwise the CPU ones
//   (a one-rank group is exact). float16 reductions (all_reduce_sum, reduce_scatter_sum) are
//   widened to float32 before NCCL sees them (the contract reduces in float32) and rounded once
//   at the end; they are counted as the float32 bytes they put on the wire. bfloat16
//   reductions are refused, as on Gloo.
// - Errors: a failure NCCL reports (a communicator that cannot be set up because a peer never
//   came within the timeout, an NCCL error) becomes UserError("<group>: <op> failed on rank R:
//   <reason>"). A collective that never completes (a dead or hung peer) is caught by
//   ProcessGroupNCCL's watchdog after the group's timeout: with TORCH_NCCL_ASYNC_ERROR_HANDLING on
//   (set to 3, tear down, unless the environment already says otherwise) it ends the process after
//   logging which collective timed out, so the run ends instead of hanging; the launcher then
//   stops the other ranks.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "mixtrain/core/collectives.h"

namespace mixtrain {

// One NCCL communicator group on `device` (a CUDA device, the calling thread's current one):
// rank `group_rank` of `group_size`, meeting on `store` (a prefix of its own per group), every
// collective timing out after `timeout`. The communicator is non-blocking (ncclConfig_t
// blocking = 0): created by connect(), or else by the first collective, its set-up is bounded
// by `timeout` too (c10d's TORCH_NCCL_NONBLOCKING_TIMEOUT, set to it in whole seconds unless the
// environment already sets it; the first group of the process fixes it). NCCL_COMM_BLOCKING=1
// in the environment would override this and make the set-up unbounded again. Shut down when
// the last holder lets go.
class NcclGroup {
 public:
  NcclGroup(const c10::intrusive_ptr<c10d::Store>& store, int group_rank, int group_size,
            c10::Device device, std::chrono::milliseconds timeout);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  // Creates the NCCL communicator now (collective over the group's ranks) and waits until it is
  // ready; throws c10::DistError when a member does not come (or dies) within the timeout: the
  // store's wait for the unique id on the others, NCCL's set-up on the rest. On that error the
  // communicator is aborted, so no NCCL thread keeps waiting.
  void connect();

  c10d::Backend& backend() const { return *backend_; }
  c10::Device device() const { return device_; }

 private:
  c10::intrusive_ptr<c10d::Backend> backend_;  // a c10d::ProcessGroupNCCL
  c10::Device device_;
  bool aborted_ = false;
};

class NcclCollectives final : public Collectives {
 public:
  // `world_rank` only labels error messages. Several may share one group (same members).
  NcclCollectives(std::shared_ptr<NcclGroup> group, std::string name, int world_rank);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override;
  at::Tensor all_gather(const at::Tensor& local) override;
  at::Tensor reduce_scatter_sum(const at::Tensor& full) override;
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void barrier() override;
  // Issued on NCCL's stream (which first waits for the current stream, so the input is
  // complete) and returned at once; wait() makes the current stream wait for it, so work
  // queued between the two runs beside the transfer. A host input is staged as in the
  // blocking call and the result copied back in wait().
  std::unique_ptr<CollectiveWork> all_to_all_async(
      const at::Tensor& input, const std::vector<int64_t>& send_counts,
      const std::vector<int64_t>& recv_counts) override;
  std::unique_ptr<CollectiveWork> all_gather_async(const at::Tensor& local) override;

 private:
  // Issues one collective and returns its Work without waiting; a failure to issue becomes
  // the UserError above.
  template <typename Issue>
  c10::intrusive_ptr<c10d::Work> issue(const char* op, Issue&& start) const;
  // Work::wait() with the same error conversion.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* op) const;
  // Issues one collective and makes the current stream wait for it; a failure becomes the
  // UserError above.
  template <typename Issue>
  void run(const char* op, Issue&& issue) const;
  // The device copy of `tensor` (itself when already there); checks device, layout and dtype.
  at::Tensor on_device(const at::Tensor& tensor, const char* op) const;

  std::shared_ptr<NcclGroup> group_;
  std::string name_;
  int rank_;
  int size_;
  int world_rank_;
};

}  // namespace mixtrain
