// The four start-up log blocks of fp32-main-params §10, as multi-line strings (the trainer
// logs them once, on rank 0):
//   Trainer config:          every resolved leaf with its source (incl. model_init_dtype and
//                            optimizer.fp32_main_params, whether defaulted or set)
//   Model config:            the model's hyper-parameters (the keys it reads: model_sections.h)
//   Effective adamw config:  per hyper-parameter: constructor default, configured value, final
//   Effective muon config:   the same for Muon, or "not used" when the target is AdamW
//   Effective sgd config:    the same for SGD, only when the target is SGD
// "Constructor default" is the default of the config's dialect (dialect_defaults.h:
// torch.optim.AdamW's and hyper-parallel's Muon defaults for YAML, torchtitan's for TOML);
// "configured" is what the file or --set gave ("-" when nothing did, or what a derived value
// came from); "final" is what the optimizer gets.
#pragma once

#include <string>

#include "mixtrain/config/load.h"

namespace mixtrain {

std::string format_trainer_config_block(const ResolvedConfig& resolved);
std::string format_model_config_block(const ModelConfig& model);
std::string format_effective_adamw_block(const ResolvedConfig& resolved);
std::string format_effective_muon_block(const ResolvedConfig& resolved);
std::string format_effective_sgd_block(const ResolvedConfig& resolved);  // "" unless SGD

}  // namespace mixtrain
