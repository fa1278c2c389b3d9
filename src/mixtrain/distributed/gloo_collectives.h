// Collectives over a c10d::ProcessGroupGloo (docs/architecture.md §7).
//
// LibTorch 1.13's Gloo has no bfloat16, no reduce_scatter, no _allgather_base and no list-form
// alltoall, so: bfloat16 travels as its bits viewed as float16 (data movement only; reductions
// of bfloat16 are refused), all_gather uses the list form into views of one output tensor, and
// reduce_scatter_sum is alltoall_base followed by a local sum in rank order (float16 payloads
// accumulate in float32). Every Work is waited on; a failure or a timeout (the group's
// Options::timeout) becomes mixtrain::UserError("<group>: <op> failed on rank R: <reason>"),
// R being this process's world rank. Every call is counted in the communication counters of
// core/collectives.h (calls, the bytes this rank sends by the convention documented there,
// seconds inside the call); argument errors, caught before any communication, are not.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <string>

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

  void all_reduce_sum(at::Tensor& tensor) override;
  at::Tensor all_gather(const at::Tensor& local) override;
  at::Tensor reduce_scatter_sum(const at::Tensor& full) override;
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void barrier() override;

  const c10::intrusive_ptr<c10d::ProcessGroupGloo>& process_group() const { return group_; }

 private:
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* op) const;
  void check_input(const at::Tensor& tensor, const char* op) const;

  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  std::string name_;
  int rank_;
  int size_;
  int world_rank_;
};

}  // namespace mixtrain
