// Collectives over a c10d::ProcessGroupGloo (docs/architecture.md §7).
//
// bfloat16 travels natively (LibTorch 2.x's Gloo moves its bytes); all_gather is _allgather_base
// into one output tensor. reduce_scatter_sum is NOT Gloo's _reduce_scatter_base: in LibTorch 2.11
// that all-reduces the whole input and keeps one chunk (twice the bytes of a reduce-scatter, and
// for more than 2 ranks a summation order that is not rank order). Ours is an equal-split
// alltoall_base followed by a local sum in rank order, so every rank and the single-process
// reference agree bit for bit, on (n-1)/n of the input's bytes (float16 payloads
// accumulate in float32). Every Work is waited on; a failure or a timeout (the group's
// Options::timeout) becomes mixtrain::UserError("<group>: <op> failed on rank R: <reason>"),
// R being this process's world rank. Every call is counted in the communication counters of
// core/collectives.h (calls, the bytes this rank sends by the convention documented there,
// seconds inside the call); argument errors, caught before any communication, are not.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/collectives.h"

namespace mixtrain {

class GlooCollectives final : public Collectives {
 public:
  // `world_rank` only labels error messages.
  GlooCollectives(c10::intrusive_ptr<c10d::ProcessGroupGloo> group, std::string name,
                  int world_rank);

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
  // Enqueued on the process group's work queue (its worker threads move the bytes) and
  // returned at once; wait() is the blocking call's wait, errors included.
  std::unique_ptr<CollectiveWork> all_to_all_async(
      const at::Tensor& input, const std::vector<int64_t>& send_counts,
      const std::vector<int64_t>& recv_counts) override;
  std::unique_ptr<CollectiveWork> all_gather_async(const at::Tensor& local) override;

  const c10::intrusive_ptr<c10d::ProcessGroupGloo>& process_group() const { return group_; }
  // Waits for `work` of `op`; a failure or timeout becomes the UserError above.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* op) const;

 private:
  void check_input(const at::Tensor& tensor, const char* op) const;

  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  std::string name_;
  int rank_;
  int size_;
  int world_rank_;
};

}  // namespace mixtrain
