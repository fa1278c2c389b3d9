#include "mixtrain/optim/param_groups.h"

namespace mixtrain {

bool is_no_decay_parameter(const std::string& name) {
  for (const char* keyword : {"bias", "norm", "ln_"}) {
    if (name.find(keyword) != std::string::npos) return true;
  }
  return false;
}

DecaySplit split_by_weight_decay(const NamedParameters& params) {
  DecaySplit split;
  for (const auto& [name, param] : params) {
    if (!param.requires_grad()) continue;
    (is_no_decay_parameter(name) ? split.no_decay : split.decay).emplace_back(name, param);
  }
  return split;
}

}  // namespace mixtrain
