// SGD with momentum and Nesterov: torch.optim.SGD (foreach=False, maximize=False) as a
// LibTorch optimizer (docs/architecture.md §5).
//
// Per parameter p with gradient g, with the group's lr, momentum (mu), dampening, weight_decay
// (wd) and nesterov; the single-tensor op sequence of torch/optim/sgd.py, so it is bitwise
// torch's on the same hardware:
//   g = g + wd * p                          (when wd != 0; coupled, unlike AdamW)
//   b = g  at the first step, else  b = mu * b + (1 - dampening) * g     (when mu != 0)
//   g = nesterov ? g + mu * b : b           (when mu != 0)
//   p -= lr * g
// then, when set_copy_back() gave p a bfloat16/float16 model param, model_param = p rounded to
// nearest even (what Tensor::to gives).
//
// State per parameter (created at its first step): "step" (int64 count of its updates) and,
// when momentum != 0, "momentum_buffer" in the param's dtype (torch keeps no buffer when
// momentum is 0). Params whose grad is undefined are skipped.
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "mixtrain/optim/leaf_optimizer.h"

namespace mixtrain {

struct SgdOptions : torch::optim::OptimizerCloneableOptions<SgdOptions> {
  SgdOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: torch's options convert from lr
  TORCH_ARG(double, lr);
  TORCH_ARG(double, momentum) = 0.0;
  TORCH_ARG(double, dampening) = 0.0;
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(bool, nesterov) = false;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct SgdParamState : torch::optim::OptimizerCloneableParamState<SgdParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(at::Tensor, momentum_buffer);  // undefined when momentum is 0
};

class Sgd : public LeafOptimizer {
 public:
  // Throws std::invalid_argument for torch's refusals in the defaults or any group: lr,
  // momentum or weight_decay < 0; nesterov without momentum > 0 and dampening 0.
  explicit Sgd(std::vector<torch::optim::OptimizerParamGroup> groups, SgdOptions defaults = {});

  at::Tensor step(LossClosure closure = nullptr) override;
  std::string kind() const override { return "sgd"; }

  // "momentum_buffer" (alias of the live state; only when the param has one) and "step"
  // (int64 scalar tensor); empty before the param's first step.
  NamedTensorList export_state(const at::Tensor& param) const override;
  // The same names ("momentum_buffer" optional; LeafOptimizer::read_state); an empty list
  // clears the param's state.
  void import_state(const at::Tensor& param, const NamedTensorList& state) override;
  std::vector<StateField> state_fields() const override;
  void set_lr(double lr) override;

  // {"momentum", "dampening", "weight_decay", "nesterov"}.
  nlohmann::json group_hyperparameters(size_t group) const override;
  std::unique_ptr<torch::optim::OptimizerOptions> options_with_hyperparameters(
      size_t group, const nlohmann::json& values) const override;
};

}  // namespace mixtrain
