#include "mixtrain/optim/sgd.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <memory>
#include <stdexcept>
#include <utility>

#include "mixtrain/optim/python_scalar.h"

namespace mixtrain {
namespace {

// The first option torch.optim.SGD refuses, or "" when all are valid (torch/optim/sgd.py).
std::string sgd_options_problem(const SgdOptions& options) {
  if (!(options.lr() >= 0)) return "invalid learning rate " + std::to_string(options.lr());
  if (!(options.momentum() >= 0)) return "invalid momentum " + std::to_string(options.momentum());
  if (!(options.weight_decay() >= 0)) {
    return "invalid weight_decay " + std::to_string(options.weight_decay());
  }
  if (options.nesterov() && (options.momentum() <= 0 || options.dampening() != 0)) {
    return "nesterov momentum requires a momentum and zero dampening";
  }
  return "";
}

// torch/optim/sgd.py _single_tensor_sgd, for one parameter; `first` is its first step.
void sgd_update(const SgdOptions& options, const at::Tensor& param, at::Tensor grad,
                SgdParamState& state, bool first) {
  if (options.weight_decay() != 0) grad = grad.add(param, options.weight_decay());
  if (options.momentum() != 0) {
    if (first) {
      state.momentum_buffer(grad.clone().detach());
    } else {
      mul_python_float_(state.momentum_buffer(), options.momentum())
          .add_(grad, 1 - options.dampening());
    }
    grad = options.nesterov() ? grad.add(state.momentum_buffer(), options.momentum())
                              : state.momentum_buffer();
  }
  param.add_(grad, -options.lr());
}

}  // namespace

Sgd::Sgd(std::vector<torch::optim::OptimizerParamGroup> groups, SgdOptions defaults)
    : LeafOptimizer(std::move(groups), std::make_unique<SgdOptions>(defaults)) {
  check_options(sgd_options_problem);
}

at::Tensor Sgd::step(LossClosure closure) {
  const at::Tensor loss = evaluate_closure(closure);
  c10::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const SgdOptions&>(group.options());
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      TORCH_CHECK(!param.grad().is_sparse(), "sgd: sparse gradients are not supported");
      const StateLease lease(*this, param);
      auto& slot = state_[state_key(param)];
      if (!slot) slot = std::make_unique<SgdParamState>();
      auto& state = static_cast<SgdParamState&>(*slot);
      // torch starts a buffer whenever it has none (a fresh param, or momentum just turned on).
      const bool first = !state.momentum_buffer().defined();
      state.step(state.step() + 1);
      sgd_update(options, param, param.grad().to(param.scalar_type()), state, first);
      const at::Tensor model = copy_back_target(param);
      if (model.defined()) model.copy_(param);  // copy_ rounds to nearest even, as to() does
    }
  }
  return loss;
}

NamedTensorList Sgd::export_state(const at::Tensor& param) const {
  auto it = state_.find(state_key(param));
  if (it == state_.end()) return {};
  const auto& state = static_cast<const SgdParamState&>(*it->second);
  NamedTensorList out;
  if (state.momentum_buffer().defined())
    out.emplace_back("momentum_buffer", state.momentum_buffer());
  out.emplace_back("step", at::scalar_tensor(state.step(), at::kLong));
  return out;
}

std::vector<StateField> Sgd::state_fields() const {
  // momentum_buffer exists once a step ran with momentum (torch.optim's sgd.py).
  return {{"momentum_buffer", StateField::Kind::kLikeParam, /*required=*/false},
          {"step", StateField::Kind::kCount}};
}

void Sgd::import_state(const at::Tensor& param, const NamedTensorList& state) {
  const CheckedState checked = read_state(param, state);
  void* const key = state_key(param);
  if (checked.empty()) {
    state_.erase(key);
    return;
  }
  auto fresh = std::make_unique<SgdParamState>();
  fresh->step(checked.counts.at("step"));
  const auto buffer = checked.tensors.find("momentum_buffer");
  if (buffer != checked.tensors.end()) {
    // A private copy in the param's dtype, laid out like the param.
    at::Tensor copy = at::empty_like(param, at::MemoryFormat::Preserve);
    copy.copy_(buffer->second);
    fresh->momentum_buffer(copy);
  }
  state_[key] = std::move(fresh);
}

void Sgd::set_lr(double lr) {
  for (auto& group : param_groups_) group.options().set_lr(lr);
}

nlohmann::json Sgd::group_hyperparameters(size_t group) const {
  const auto& options = static_cast<const SgdOptions&>(param_groups_.at(group).options());
  return {{"momentum", options.momentum()},
          {"dampening", options.dampening()},
          {"weight_decay", options.weight_decay()},
          {"nesterov", options.nesterov()}};
}

std::unique_ptr<torch::optim::OptimizerOptions> Sgd::options_with_hyperparameters(
    size_t group, const nlohmann::json& values) const {
  const auto& options = static_cast<const SgdOptions&>(param_groups_.at(group).options());
  HyperparameterReader reader(values);
  SgdOptions candidate = options;
  candidate.momentum(reader.number("momentum"))
      .dampening(reader.number("dampening"))
      .weight_decay(reader.number("weight_decay"))
      .nesterov(reader.boolean("nesterov"));
  reader.finish();
  const std::string problem = sgd_options_problem(candidate);
  if (!problem.empty()) throw std::invalid_argument(problem);
  return std::make_unique<SgdOptions>(candidate);
}

}  // namespace mixtrain
