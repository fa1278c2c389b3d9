// Builds the optimizer stack from the config, in the fp32-main-params §7.2 order:
//   route_parameters -> one leaf per optimizer-table entry that got parameters, in table order,
//   made by the entry's make() with one param group per distinct (lr, weight_decay), in model
//   order -> ChainedOptimizer -> MixedPrecisionOptimizer
//   iff optimizer.fp32_main_params.
// With optimizer.muon_config.muon_per_head, Muon orthogonalizes the weight of every q, k and v
// projection per head along dim 0 and of every o projection along dim 1, heads of
// model.head_dim (Muon::set_head_split), as `roles` (the model's, core/param_role.h) says;
// per_head without roles is a ConfigError. It logs how many it split.
// Logs the routing table with log_info. float16 params without fp32_main_params are a
// ConfigError on optimizer.fp32_main_params (core/error.h ConfigKey): float16 needs fp32 main
// params and loss scaling (docs/architecture.md §6). The config's own rules (fp32-main-params
// §2.5 among them) are validate_config's; callers validate first.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/core/param_role.h"
#include "mixtrain/optim/training_optimizer.h"

namespace mixtrain {

std::unique_ptr<TrainingOptimizer> build_optimizer(
    const std::vector<std::pair<std::string, at::Tensor>>& named_params,
    const TrainerConfig& config, const ParamRoles& roles = {});

}  // namespace mixtrain
