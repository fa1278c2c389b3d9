// TOML dialect (torchtitan-npu keys and semantics): document -> TrainerConfig.
//
// Sections [job] [optimizer] [training] [lr_scheduler] [parallelism] [checkpoint] [metrics]
// [validation] [profiling] [comm] [model]. Most keys map one-to-one onto a canonical key; the
// rest follow torchtitan (global batch, checkpoint folder and modes). The optimizer sections
// (section.h) add their own TOML keys, defaults and translation (the flat [optimizer] table's
// shared lr, eps and weight decay: optim/optimizer_table.h); the routing rule is "toml".
// docs/config.md lists every key.
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
