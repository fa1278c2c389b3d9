// The start-up log blocks of fp32-main-params §10, as multi-line strings (the trainer logs them
// once, on rank 0):
//   Trainer config:            every resolved leaf with its source (incl. model_init_dtype and
//                              optimizer.fp32_main_params, whether defaulted or set)
//   Model config:              the model's hyper-parameters (the keys it reads: model_sections.h)
//   Effective <name> config:   per option of an optimizer: constructor default, configured
//                              value, final (each optimizer's block: optim/optimizer_table.h)
// "Constructor default" is the default of the config's dialect (dialect_defaults.h: the YAML
// dialect's defaults, torchtitan's for TOML); "configured" is what the file or --set gave ("-"
// when nothing did, or what a derived value came from); "final" is what the optimizer gets.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/config/load.h"

namespace mixtrain {

std::string format_trainer_config_block(const ResolvedConfig& resolved);
std::string format_model_config_block(const ModelConfig& model);
// "<title>" and a table: one row per canonical leaf under `prefix` (named by the rest of its
// key) and per key of `also` (named by its last part): default, configured, final.
std::string format_effective_block(const ResolvedConfig& resolved, const std::string& title,
                                   const std::string& prefix,
                                   const std::vector<std::string>& also = {});

}  // namespace mixtrain
