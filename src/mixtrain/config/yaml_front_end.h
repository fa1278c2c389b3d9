// YAML dialect (hyper-parallel keys, canonical): document -> TrainerConfig.
//
// Every settable canonical key is accepted verbatim; sections may be empty (null). Unknown keys
// are errors naming the closest valid key. optimizer._target_ accepts an optimizer's name and
// the seed's dotted class paths, normalised to the class name. Range checks live in
// validate.h.
#pragma once

#include "mixtrain/config/document.h"
#include "mixtrain/config/provenance.h"
#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

// Every key a YAML file or a YAML --set may name (leaves only).
const std::vector<std::string>& yaml_keys();

// Fills `config` (which starts at its defaults) and records every leaf it sets in `provenance`.
void translate_yaml(const DocValue& document, TrainerConfig& config, Provenance& provenance);

}  // namespace mixtrain
