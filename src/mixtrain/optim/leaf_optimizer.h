// Base of the leaf optimizers (AdamW, Muon): LibTorch's torch::optim::Optimizer conventions
// (param_groups(), state(), step(), zero_grad()), so a LibTorch user can drop one into an
// ordinary training loop, plus the three hooks the mixed-precision wrapper needs (RFC 7.2-7.3):
//
// - replace_parameter(old, new): put `new` where `old` was in its param group and move its
//   state with it (the wrapper swaps each low-precision model param for its fp32 main param);
// - set_copy_back(param, model_param): after every update of `param`, write its value rounded
//   to model_param's dtype (round to nearest even, as Tensor::to does) into model_param. Leaves
//   fuse this into their update pass, so the low-precision weights are written while the
//   fp32 value is still in registers;
// - reset_parameter_caches(): rebuild whatever a leaf caches per parameter object (Muon's
//   same-shape batches) after parameters were replaced.
//
// State is exported and imported per parameter as named tensors ("exp_avg", "exp_avg_sq",
// "momentum_buffer", "step"), so the owner can key it by the model parameter's name.
#pragma once

#include <torch/optim/optimizer.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mixtrain {

using NamedTensorList = std::vector<std::pair<std::string, at::Tensor>>;

class LeafOptimizer : public torch::optim::Optimizer {
 public:
  using torch::optim::Optimizer::Optimizer;

  // "adamw" or "muon": used in logs and error messages.
  virtual std::string kind() const = 0;

  void replace_parameter(const at::Tensor& old_param, const at::Tensor& new_param);
  void set_copy_back(const at::Tensor& param, const at::Tensor& model_param);
  virtual void reset_parameter_caches() {}

  // State of one parameter (empty before its first step). Tensors alias the live state.
  virtual NamedTensorList export_state(const at::Tensor& param) const = 0;
  // Replaces the state of one parameter with copies of `state` (same names as export_state);
  // throws std::invalid_argument naming the missing/extra key or the shape mismatch.
  virtual void import_state(const at::Tensor& param, const NamedTensorList& state) = 0;

  // Learning rate of every group (the LR schedule sets base_lr * factor each step).
  virtual void set_lr(double lr) = 0;

 protected:
  static std::string state_key(const at::Tensor& param);
  // Undefined tensor when `param` has no copy-back target.
  at::Tensor copy_back_target(const at::Tensor& param) const;

 private:
  std::unordered_map<const void*, at::Tensor> copy_back_;  // keyed by TensorImpl
};

}  // namespace mixtrain
