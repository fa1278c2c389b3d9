// SGD's config section (config/section.h): torch.optim.SGD's options under
// optimizer.sgd_config.sgd_*. YAML only: torchtitan-npu's flat [optimizer] table has no keys
// for SGD's momentum, dampening and nesterov, so a TOML config naming SGD is refused.
#pragma once

#include <string>

#include "mixtrain/config/load.h"
#include "mixtrain/config/section.h"
#include "mixtrain/optim/sgd.h"

namespace mixtrain {

inline const SgdOptions& sgd_config(const TrainerConfig& config) {
  return config.optimizer.options.get<SgdOptions>();
}
inline SgdOptions& sgd_config(TrainerConfig& config) {
  return config.optimizer.options.get<SgdOptions>();
}

ConfigSectionSpec sgd_config_section();

// "Effective sgd config:" (config/startup_log.h), "" unless the target is SGD.
std::string format_effective_sgd_block(const ResolvedConfig& resolved);

}  // namespace mixtrain
