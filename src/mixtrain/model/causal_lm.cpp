#include "mixtrain/model/causal_lm.h"

#include <stdexcept>

namespace mixtrain {

const char* param_role_name(ParamRole role) {
  switch (role) {
    case ParamRole::kEmbedding:
      return "embedding";
    case ParamRole::kAttention:
      return "attention";
    case ParamRole::kMlp:
      return "mlp";
    case ParamRole::kRouter:
      return "router";
    case ParamRole::kExpert:
      return "expert";
    case ParamRole::kNorm:
      return "norm";
    case ParamRole::kOutputHead:
      return "output_head";
  }
  return "unknown";
}

ParamRole CausalLM::param_role(const std::string& name) const {
  const auto it = roles_.find(name);
  if (it == roles_.end()) {
    throw std::invalid_argument("model " + config().name + ": no parameter role for '" + name +
                                "'");
  }
  return it->second;
}

void CausalLM::assign_param_role(const std::string& prefix, torch::nn::Module& module,
                                 ParamRole role) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    roles_[prefix + item.key()] = role;
  }
}

}  // namespace mixtrain
