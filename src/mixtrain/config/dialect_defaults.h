// The "constructor default" of each dialect: the configuration an empty file of that dialect
// resolves to (fp32-main-params §10). YAML (hyper-parallel): TrainerConfig{}, each optimizer
// section at its own defaults. TOML (torchtitan-npu): torchtitan's defaults and derivations
// (the sections' toml_defaults and translate_toml, section.h). A config built in code (dialect
// "yaml" by default) gets the YAML defaults.
// The start-up log's effective blocks and the trainer's optimizer report show this column.
#pragma once

#include <string>

#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

// Throws ConfigError naming the `dialect` leaf for anything but "yaml" or "toml" (a config
// built in code can hold any string there).
TrainerConfig dialect_default_config(const std::string& dialect);

}  // namespace mixtrain
