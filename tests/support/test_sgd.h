// A test double for LeafOptimizer: heavy-ball SGD, simple enough to predict by hand.
//   buf = 0.5 * buf + g (buf = g at the first step);  p *= 1 - lr * wd;  p -= lr * buf
// plus the copy-back into the model param when the mixed-precision wrapper asked for it.
// Shared by the ChainedOptimizer and MixedPrecisionOptimizer tests.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/arg.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixtrain/optim/leaf_optimizer.h"

namespace mixtrain::test_doubles {

struct TestSgdOptions : torch::optim::OptimizerCloneableOptions<TestSgdOptions> {
  TestSgdOptions(double lr = 0.1, double weight_decay = 0.0)
      : lr_(lr), weight_decay_(weight_decay) {}
  TORCH_ARG(double, lr);
  TORCH_ARG(double, weight_decay);

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct TestSgdState : torch::optim::OptimizerCloneableParamState<TestSgdState> {
  at::Tensor momentum_buffer;
  int64_t step = 0;
};

class TestSgd : public LeafOptimizer {
 public:
  explicit TestSgd(std::vector<torch::optim::OptimizerParamGroup> groups)
      : LeafOptimizer(std::move(groups), std::make_unique<TestSgdOptions>()) {}
  at::Tensor step(LossClosure = nullptr) override {
    c10::NoGradGuard no_grad;
    for (auto& group : param_groups_) {
      const auto& options = static_cast<const TestSgdOptions&>(group.options());
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& slot = state_[state_key(p)];
        if (!slot) slot = std::make_unique<TestSgdState>();
        auto& state = static_cast<TestSgdState&>(*slot);
        if (!state.momentum_buffer.defined()) {
          state.momentum_buffer = p.grad().detach().clone();
        } else {
          state.momentum_buffer.mul_(0.5).add_(p.grad());
        }
        ++state.step;
        p.mul_(1.0 - options.lr() * options.weight_decay());
        p.sub_(state.momentum_buffer * options.lr());
        at::Tensor target = copy_back_target(p);
        if (target.defined()) target.copy_(p);
      }
    }
    return {};
  }
  std::string kind() const override { return "sgd"; }
  NamedTensorList export_state(const at::Tensor& param) const override {
    auto it = state_.find(state_key(param));
    if (it == state_.end()) return {};
    const auto& state = static_cast<const TestSgdState&>(*it->second);
    return {{"momentum_buffer", state.momentum_buffer},
            {"step", at::scalar_tensor(state.step, at::kLong)}};
  }
  void import_state(const at::Tensor& param, const NamedTensorList& entries) override {
    auto state = std::make_unique<TestSgdState>();
    for (const auto& [name, tensor] : entries) {
      if (name == "momentum_buffer") {
        state->momentum_buffer = tensor.detach().clone();
      } else if (name == "step") {
        state->step = tensor.item<int64_t>();
      } else {
        throw std::invalid_argument("sgd: unknown state " + name);
      }
    }
    state_[state_key(param)] = std::move(state);
  }
  void set_lr(double lr) override {
    for (auto& group : param_groups_) group.options().set_lr(lr);
  }
  nlohmann::json group_hyperparameters(size_t group) const override {
    return {{"weight_decay",
             static_cast<const TestSgdOptions&>(param_groups_.at(group).options()).weight_decay()}};
  }
  std::unique_ptr<torch::optim::OptimizerOptions> options_with_hyperparameters(
      size_t group, const nlohmann::json& values) const override {
    auto options = std::make_unique<TestSgdOptions>(
        static_cast<const TestSgdOptions&>(param_groups_.at(group).options()));
    HyperparameterReader reader(values);
    const double weight_decay = reader.number("weight_decay");
    reader.finish();
    if (!(weight_decay >= 0)) throw std::invalid_argument("invalid weight_decay");
    options->weight_decay(weight_decay);
    return options;
  }
  void reset_parameter_caches() override { ++cache_resets; }
  int cache_resets = 0;
};

inline std::unique_ptr<TestSgd> make_sgd(std::vector<at::Tensor> params, double lr,
                                         double wd = 0.0) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::move(params), std::make_unique<TestSgdOptions>(lr, wd));
  return std::make_unique<TestSgd>(std::move(groups));
}

}  // namespace mixtrain::test_doubles
