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
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/parallel_plan.h"
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

// Step 1 of parallelize (parallelize.h; mesh.tp > 1): every parameter the model splits
// (CausalLM::tp_dim(name) >= 0: 0 for column-parallel weights and biases and the vocabulary of
// embed_tokens and lm_head, 1 for row-parallel weights) is planned as this tp rank's even slice
// along that dim (placement tp_dim / tp_group; what later steps place is that slice); the model
// gets a TensorParallel over mesh.tp_group. Its gradients are reduced over the data-parallel
// ranks only, never over tp (Megatron without sequence parallelism: the parameters every tp rank
// holds whole get bitwise identical gradients on each). std::invalid_argument when the tp group
// does not divide a split dimension.
void plan_tensor_parallel(const CausalLM& model, const DeviceMesh& mesh, ParallelPlan& plan);

}  // namespace mixtrain
