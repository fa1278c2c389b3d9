// The narrow collective-communication interface the optimizer and the parallel layouts use
// (DESIGN §2, §7). optim/ and model/ talk only to this; distributed/ implements it on c10d's
// ProcessGroupGloo (NCCL on CUDA builds), and LocalCollectives is the one-rank identity, so the
// single-process reference and every parallel layout run the same code.
//
// Every call is collective over the group: all ranks call it in the same order with tensors of
// the same dtype and shape (except where a split says otherwise). Tensors are contiguous CPU
// tensors. Payload dtypes: float32, float64, bfloat16, float16, int32, int64, uint8 — bfloat16
// travels as its bits (Gloo in LibTorch 1.13 has no bfloat16), so reductions of bfloat16 are
// not offered: reduce in float32. A failed or timed-out peer raises mixtrain::UserError naming
// the operation and the group.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mixtrain {

class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual int rank() const = 0;          // rank within this group
  virtual int size() const = 0;          // ranks in this group
  virtual std::string name() const = 0;  // e.g. "dp_shard", for error messages

  // In-place sum over the group (float32/float64/int64).
  virtual void all_reduce_sum(at::Tensor& tensor) = 0;
  // Concatenation along dim 0 of every rank's `local` (equal shapes), in rank order.
  virtual at::Tensor all_gather(const at::Tensor& local) = 0;
  // `full` has size() equal chunks along dim 0; returns the sum over ranks of chunk rank()
  // (float32/float64). Same bytes on the wire as a ring reduce-scatter.
  virtual at::Tensor reduce_scatter_sum(const at::Tensor& full) = 0;
  // Rows [offset_i, offset_i + send_counts[i]) of `input` (dim 0) go to rank i; returns the
  // rows received, rank order, shaped [sum(recv_counts), input.shape[1:]...].
  virtual at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_counts,
                                const std::vector<int64_t>& recv_counts) = 0;
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;
};

// Every rank's `text`, in rank order (variable lengths: the lengths travel first). Collective.
std::vector<std::string> all_gather_strings(Collectives& group, const std::string& text);

// The one-rank group: every collective is the identity (all_gather/reduce_scatter/all_to_all
// return a copy of their input).
std::unique_ptr<Collectives> make_local_collectives(const std::string& name = "local");

}  // namespace mixtrain
