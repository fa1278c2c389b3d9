// The "constructor default" of each dialect: the configuration an empty file of that dialect
// resolves to (fp32-main-params §10). YAML (hyper-parallel): TrainerConfig{}, i.e.
// torch.optim.AdamW's defaults and the hyper-parallel Muon defaults. TOML (torchtitan-npu):
// torchtitan's defaults and derivations (lr 8e-4, betas (0.9, 0.95), weight decay 0.1 shared
// with Muon, momentum ema_add, matched_adamw_rms 0.18, the Muon lr and ns epsilon taken from
// lr and eps, ...). A config built in code (dialect "yaml" by default) gets the YAML defaults.
// The start-up log's effective blocks and the trainer's optimizer report show this column.
#pragma once

#include <string>

#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

// Throws ConfigError naming the `dialect` leaf for anything but "yaml" or "toml" (a config
// built in code can hold any string there).
TrainerConfig dialect_default_config(const std::string& dialect);

}  // namespace mixtrain
