// AdamW's config section (config/section.h): torch.optim.AdamW's options under
// optimizer.adamw_config.adamw_* (TOML: the flat [optimizer] table's lr, eps, weight_decay,
// beta1, beta2, with torchtitan's defaults lr 8e-4, weight decay 0.1, betas (0.9, 0.95)).
#pragma once

#include <torch/optim/adamw.h>

#include <string>

#include "mixtrain/config/load.h"
#include "mixtrain/config/section.h"

namespace mixtrain {

inline const torch::optim::AdamWOptions& adamw_config(const TrainerConfig& config) {
  return config.optimizer.options.get<torch::optim::AdamWOptions>();
}
inline torch::optim::AdamWOptions& adamw_config(TrainerConfig& config) {
  return config.optimizer.options.get<torch::optim::AdamWOptions>();
}

ConfigSectionSpec adamw_config_section();

// "Effective adamw config:" (config/startup_log.h).
std::string format_effective_adamw_block(const ResolvedConfig& resolved);

}  // namespace mixtrain
