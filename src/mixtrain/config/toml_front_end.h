// TOML dialect (torchtitan-npu keys and semantics): document -> TrainerConfig.
//
// Sections [job] [optimizer] [training] [lr_scheduler] [parallelism] [checkpoint] [metrics]
// [model]. Most keys map one-to-one onto a canonical key; the rest follow torchtitan-npu:
// betas (0.9, 0.95); `eps` is also the Newton-Schulz epsilon; `weight_decay` is shared by
// Muon and AdamW; momentum ema_add; matched_adamw_rms 0.18; muon_hybrid_ns picks hybrid or
// legacy coefficients; the Muon lr is muon_lr (falling back to lr) in "original" mode and lr
// in "match_rms_adamw" mode, where a set muon_lr is ignored with a warning; routing "toml".
// Absent [optimizer] keys and the mixed-precision keys take torchtitan's defaults; docs/config.md
// lists every key.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/config/document.h"
#include "mixtrain/config/provenance.h"
#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

// Every "section.key" a TOML file or a TOML --set may name.
const std::vector<std::string>& toml_keys();

// The TOML key for a canonical key and back ("" when there is no one-to-one counterpart):
// suggestions for keys written in the other dialect.
std::string toml_key_for(const std::string& canonical_key);
std::string canonical_key_for(const std::string& toml_key);

// Fills `config` (which starts at its defaults) and records every leaf it sets in `provenance`.
void translate_toml(const DocValue& document, TrainerConfig& config, Provenance& provenance);

}  // namespace mixtrain
