#include "mixtrain/optim/leaf_optimizer.h"

#include "mixtrain/optim/state_swap.h"

#include <c10/core/GradMode.h>

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

namespace mixtrain {

void* LeafOptimizer::state_key(const at::Tensor& param) {
  // The key torch::optim::Optimizer uses for state_ (torch/csrc/api/src/optim/*.cpp).
  return param.unsafeGetTensorImpl();
}

void LeafOptimizer::replace_parameter(const at::Tensor& old_param, const at::Tensor& new_param) {
  for (auto& group : param_groups_) {
    for (auto& p : group.params()) {
      if (!p.is_same(old_param)) continue;
      p = new_param;
      auto it = state_.find(state_key(old_param));
      if (it != state_.end()) {
        auto moved = std::move(it->second);
        state_.erase(it);
        state_[state_key(new_param)] = std::move(moved);
      }
      auto target = copy_back_.find(old_param.unsafeGetTensorImpl());
      if (target != copy_back_.end()) {
        at::Tensor model_param = target->second;
        copy_back_.erase(target);
        copy_back_[new_param.unsafeGetTensorImpl()] = model_param;
      }
      return;
    }
  }
  throw std::invalid_argument(kind() + ": replace_parameter: parameter is not in any group");
}

void LeafOptimizer::set_copy_back(const at::Tensor& param, const at::Tensor& model_param) {
  TORCH_CHECK(param.sizes() == model_param.sizes(), kind(),
              ": copy-back target shape differs from the parameter");
  copy_back_[param.unsafeGetTensorImpl()] = model_param;
}

void LeafOptimizer::check_each_options(
    const std::function<std::string(const torch::optim::OptimizerOptions&)>& problem) const {
  std::string found = problem(*defaults_);
  if (!found.empty()) throw std::invalid_argument(kind() + ": defaults: " + found);
  for (size_t i = 0; i < param_groups_.size(); ++i) {
    found = problem(param_groups_[i].options());
    if (!found.empty()) {
      throw std::invalid_argument(kind() + ": param group " + std::to_string(i) + ": " + found);
    }
  }
}

at::Tensor LeafOptimizer::copy_back_target(const at::Tensor& param) const {
  auto it = copy_back_.find(param.unsafeGetTensorImpl());
  return it == copy_back_.end() ? at::Tensor() : it->second;
}

std::string hyperparameter_type_error(const std::string& name, const std::string& what,
                                      const nlohmann::json& value) {
  return "field '" + name + "' must be " + what + ", got " + value.type_name();
}

HyperparameterReader::HyperparameterReader(const nlohmann::json& values) : values_(values) {
  if (!values.is_object()) {
    throw std::invalid_argument(std::string("hyper-parameters must be a JSON object, got ") +
                                values.type_name());
  }
}

const nlohmann::json& HyperparameterReader::field(const std::string& name) {
  auto it = values_.find(name);
  if (it == values_.end()) throw std::invalid_argument("missing field '" + name + "'");
  read_.insert(name);
  return *it;
}

double HyperparameterReader::number(const std::string& name) {
  const nlohmann::json& value = field(name);
  if (!value.is_number()) {
    throw std::invalid_argument(hyperparameter_type_error(name, "a number", value));
  }
  return value.get<double>();
}

int64_t HyperparameterReader::integer(const std::string& name) {
  const nlohmann::json& value = field(name);
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      throw std::invalid_argument("field '" + name + "' is out of range: " + value.dump());
    }
    return static_cast<int64_t>(value.get<uint64_t>());
  }
  if (!value.is_number_integer()) {
    throw std::invalid_argument(hyperparameter_type_error(name, "an integer", value));
  }
  return value.get<int64_t>();
}

bool HyperparameterReader::boolean(const std::string& name) {
  const nlohmann::json& value = field(name);
  if (!value.is_boolean()) {
    throw std::invalid_argument(hyperparameter_type_error(name, "a boolean", value));
  }
  return value.get<bool>();
}

std::string HyperparameterReader::string(const std::string& name) {
  const nlohmann::json& value = field(name);
  if (!value.is_string()) {
    throw std::invalid_argument(hyperparameter_type_error(name, "a string", value));
  }
  return value.get<std::string>();
}

void HyperparameterReader::finish() const {
  for (auto it = values_.begin(); it != values_.end(); ++it) {
    if (!read_.count(it.key())) throw std::invalid_argument("unexpected field '" + it.key() + "'");
  }
}

at::Tensor LeafOptimizer::evaluate_closure(const LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

void LeafOptimizer::acquire_state(const at::Tensor& param) {
  if (swap_ != nullptr) swap_->acquire(*this, param);
}

void LeafOptimizer::release_state(const at::Tensor& param) {
  if (swap_ != nullptr) swap_->release(*this, param);
}

LeafOptimizer::StateLease::StateLease(LeafOptimizer& leaf, const at::Tensor& param)
    : leaf_(leaf), param_(param), exceptions_(std::uncaught_exceptions()) {
  leaf_.acquire_state(param_);
}

LeafOptimizer::StateLease::~StateLease() noexcept(false) {
  if (std::uncaught_exceptions() == exceptions_) leaf_.release_state(param_);
}

}  // namespace mixtrain
