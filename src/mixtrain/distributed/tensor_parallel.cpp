#include "mixtrain/distributed/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace mixtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

TensorParallel* tp_of(const AutogradContext* ctx) {
  return reinterpret_cast<TensorParallel*>(ctx->saved_data.at("tp").toInt());
}

// Megatron's f.
struct CopyToTp : public torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, TensorParallel* tp) {
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {tp_of(ctx)->sum(grads[0]), at::Tensor()};
  }
};

// Megatron's g.
struct ReduceFromTp : public torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, TensorParallel* tp) {
    return tp->sum(x);
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

struct VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& labels, TensorParallel* tp) {
    const int64_t local_vocab = logits.size(1);
    const int64_t start = tp->tp_rank() * local_vocab;
    // The global max per token: Collectives has sum reductions only, so gather the tp maxes.
    const at::Tensor local_max = std::get<0>(logits.max(1));
    const at::Tensor global_max =
        std::get<0>(tp->group().all_gather(local_max.unsqueeze(0).contiguous()).max(0));
    const at::Tensor shifted = logits - global_max.unsqueeze(1);
    const at::Tensor exp = shifted.exp();
    // Labels outside this rank's columns read column 0 and are zeroed.
    const at::Tensor outside = (labels < start).logical_or(labels >= start + local_vocab);
    const at::Tensor local_labels = (labels - start).masked_fill(outside, 0);
    const at::Tensor target =
        shifted.gather(1, local_labels.unsqueeze(1)).squeeze(1).masked_fill(outside, 0.0);
    // One all-reduce for both sums: [sum exp, target] per token.
    at::Tensor sums = torch::stack({exp.sum(1), target}).contiguous();
    tp->group().all_reduce_sum(sums);
    const at::Tensor sum_exp = sums[0];
    ctx->save_for_backward({exp.div_(sum_exp.unsqueeze(1)), local_labels, outside});
    return sum_exp.log() - sums[1];
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& local_labels = saved[1];
    const at::Tensor& outside = saved[2];
    // softmax - onehot(label) on this rank's columns, times the upstream per-token gradient.
    at::Tensor grad = softmax.clone();
    grad.scatter_add_(1, local_labels.unsqueeze(1),
                      outside.logical_not().to(grad.scalar_type()).neg().unsqueeze(1));
    grad.mul_(grads[0].unsqueeze(1));
    return {grad, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

TensorParallel::TensorParallel(std::shared_ptr<Collectives> group) : group_(std::move(group)) {
  if (!group_) throw std::invalid_argument("TensorParallel: no tp group");
}

at::Tensor TensorParallel::sum(const at::Tensor& x) const {
  c10::NoGradGuard no_grad;
  const auto wire = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor t = x.to(wire, /*non_blocking=*/false, /*copy=*/true).contiguous();
  group_->all_reduce_sum(t);
  return t.to(x.scalar_type());
}

torch::Tensor TensorParallel::copy_to_tp(const torch::Tensor& x) {
  return CopyToTp::apply(x, this);
}

torch::Tensor TensorParallel::reduce_from_tp(const torch::Tensor& x) {
  return ReduceFromTp::apply(x, this);
}

torch::Tensor TensorParallel::vocab_parallel_cross_entropy(const torch::Tensor& local_logits,
                                                           const torch::Tensor& labels) {
  if (local_logits.dim() != 2 || labels.dim() != 1 || labels.size(0) != local_logits.size(0)) {
    throw std::invalid_argument(
        "vocab_parallel_cross_entropy: expects logits [N, V/tp] and labels [N]");
  }
  return VocabParallelCrossEntropy::apply(local_logits.to(at::kFloat), labels, this);
}

void plan_tensor_parallel(const CausalLM& model, const DeviceMesh& mesh, ParallelPlan& plan) {
  const int64_t tp = mesh.tp_group->size();
  for (PlannedParam& p : plan.params) {
    const int64_t dim = model.tp_dim(p.name);
    if (dim < 0) continue;
    const std::vector<int64_t>& shape = p.placement.global_shape;
    if (dim >= static_cast<int64_t>(shape.size()) || shape[dim] % tp != 0) {
      throw std::invalid_argument("parallelize: the tp group of " + std::to_string(tp) +
                                  " cannot split " + p.name + " along dim " + std::to_string(dim));
    }
    p.tp_dim = dim;
    p.placement.tp_dim = dim;
    p.placement.tp_group = mesh.tp_group;
  }
  plan.tp_group = mesh.tp_group;
  plan.tensor_parallel = std::make_shared<TensorParallel>(mesh.tp_group);
}

}  // namespace mixtrain
