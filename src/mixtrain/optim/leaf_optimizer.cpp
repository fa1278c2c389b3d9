#include "mixtrain/optim/leaf_optimizer.h"

#include "mixtrain/optim/state_swap.h"

#include <c10/core/GradMode.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>

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

void LeafOptimizer::set_group_hyperparameters(size_t group, const nlohmann::json& values) {
  std::unique_ptr<torch::optim::OptimizerOptions> options =
      options_with_hyperparameters(group, values);
  param_groups_.at(group).set_options(std::move(options));
}

std::vector<std::string> LeafOptimizer::check_state(const at::Tensor& param,
                                                    const NamedTensorList& state) const {
  std::vector<std::string> problems;
  bool in_group = false;
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) in_group = in_group || p.is_same(param);
  }
  if (!in_group) return {"parameter is not in any group"};
  const std::vector<StateField> fields = state_fields();
  // No state (export_state's answer before a step), or a leaf that declares none.
  if (state.empty() || fields.empty()) return problems;
  std::unordered_map<std::string, const at::Tensor*> given;
  for (const auto& [name, value] : state) {
    const bool known = std::any_of(fields.begin(), fields.end(),
                                   [&](const StateField& f) { return f.name == name; });
    if (!known) {
      problems.push_back("unknown key '" + name + "'");
    } else if (!given.emplace(name, &value).second) {
      problems.push_back("duplicate key '" + name + "'");
    } else if (!value.defined()) {
      problems.push_back("'" + name + "' is undefined");
    }
  }
  for (const StateField& field : fields) {
    const auto it = given.find(field.name);
    if (it == given.end()) {
      if (field.required) problems.push_back("missing key '" + field.name + "'");
      continue;
    }
    const at::Tensor& value = *it->second;
    if (!value.defined()) continue;  // reported above
    if (field.kind == StateField::Kind::kLikeParam) {
      if (value.sizes() != param.sizes()) {
        problems.push_back("'" + field.name + "' has shape " + c10::str(value.sizes()) +
                           ", the parameter " + c10::str(param.sizes()));
      }
      continue;
    }
    if (field.kind == StateField::Kind::kPerRow) {
      const auto rows = param.sizes().slice(0, std::max<int64_t>(param.dim() - 1, 0));
      if (value.sizes() != rows) {
        problems.push_back("'" + field.name + "' has shape " + c10::str(value.sizes()) +
                           ", expected " + c10::str(rows) +
                           " (one value per row of the parameter " + c10::str(param.sizes()) + ")");
      }
      continue;
    }
    if (value.numel() != 1 || value.scalar_type() == at::kBool || value.is_complex()) {
      problems.push_back("'" + field.name +
                         "' must be one whole number >= " + std::to_string(field.min) + ", got a " +
                         c10::toString(value.scalar_type()) + " tensor of shape " +
                         c10::str(value.sizes()));
      continue;
    }
    // A floating count must hold a whole number int64 represents exactly (2^63 is above it).
    const double number = value.item<double>();
    const bool whole = at::isFloatingType(value.scalar_type())
                           ? std::isfinite(number) && number == std::floor(number) &&
                                 std::fabs(number) < 9.2233720368547758e18
                           : true;
    if (!whole || value.item<int64_t>() < field.min) {
      problems.push_back("'" + field.name +
                         "' must be one whole number >= " + std::to_string(field.min) + ", got " +
                         (whole ? std::to_string(value.item<int64_t>()) : c10::str(number)));
    }
  }
  return problems;
}

bool LeafOptimizer::is_count_field(const std::string& name) const {
  for (const StateField& field : state_fields()) {
    if (field.name == name) return field.kind == StateField::Kind::kCount;
  }
  return false;
}

CheckedState LeafOptimizer::read_state(const at::Tensor& param,
                                       const NamedTensorList& state) const {
  const std::vector<std::string> problems = check_state(param, state);
  if (!problems.empty()) {
    std::string message;
    for (const auto& problem : problems) message += (message.empty() ? "" : "; ") + problem;
    throw std::invalid_argument(kind() + ": import_state: " + message);
  }
  CheckedState out;
  for (const auto& [name, value] : state) {
    for (const StateField& field : state_fields()) {
      if (field.name != name) continue;
      if (field.kind != StateField::Kind::kCount) {
        out.tensors[name] = value;
      } else {
        out.counts[name] = value.item<int64_t>();
      }
    }
  }
  return out;
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
