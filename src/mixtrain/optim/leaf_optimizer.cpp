#include "mixtrain/optim/leaf_optimizer.h"

#include <c10/util/string_utils.h>

#include <stdexcept>

namespace mixtrain {

std::string LeafOptimizer::state_key(const at::Tensor& param) {
  // The key torch::optim::Optimizer uses for state_ (torch/csrc/api/src/optim/*.cpp).
  return c10::guts::to_string(param.unsafeGetTensorImpl());
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

at::Tensor LeafOptimizer::copy_back_target(const at::Tensor& param) const {
  auto it = copy_back_.find(param.unsafeGetTensorImpl());
  return it == copy_back_.end() ? at::Tensor() : it->second;
}

}  // namespace mixtrain
