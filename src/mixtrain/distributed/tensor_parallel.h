// Tensor parallelism's communication (model/causal_lm.h TensorParallelHooks; Megatron-LM's f, g
// and vocabulary-parallel cross-entropy) over one tp group (mesh.tp_group).
//
//   copy_to_tp(x)       forward x; backward sum_tp(grad)
//   reduce_from_tp(x)   forward sum_tp(x); backward grad
//   vocab_parallel_cross_entropy(z_local [N, V/tp], labels [N]):
//     m = max over the vocabulary (all_gather of the local maxes, no gradient: the loss does not
//     depend on it), s = sum_tp sum_v exp(z - m), t = z[label] - m from the rank owning the
//     label (zero elsewhere, summed over tp), loss = log(s) - t;
//     d loss / d z_local = softmax(z)_local - onehot(label)_local (each rank its own columns).
// Sums run in float32 whatever the input dtype (Collectives cannot reduce bfloat16 / float16:
// a sum of bf16 would round every partial sum) and are cast back; float64 stays float64. Every
// call is collective over the tp group and must be issued in the same order on its ranks.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "mixtrain/core/collectives.h"
#include "mixtrain/model/causal_lm.h"

namespace mixtrain {

class TensorParallel : public TensorParallelHooks {
 public:
  explicit TensorParallel(std::shared_ptr<Collectives> group);

  int64_t tp_size() const override { return group_->size(); }
  int64_t tp_rank() const override { return group_->rank(); }
  torch::Tensor copy_to_tp(const torch::Tensor& x) override;
  torch::Tensor reduce_from_tp(const torch::Tensor& x) override;
  torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& local_logits,
                                             const torch::Tensor& labels) override;

  Collectives& group() const { return *group_; }
  // The sum of x over the group, float32 on the wire (float64 as is), cast back to x's dtype;
  // no autograd. Collective.
  at::Tensor sum(const at::Tensor& x) const;

 private:
  std::shared_ptr<Collectives> group_;
};

}  // namespace mixtrain
