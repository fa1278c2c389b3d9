#include "mixtrain/config/dialect_defaults.h"

#include "mixtrain/config/document.h"
#include "mixtrain/config/provenance.h"
#include "mixtrain/config/toml_front_end.h"
#include "mixtrain/config/yaml_front_end.h"
#include "mixtrain/core/error.h"

namespace mixtrain {

TrainerConfig dialect_default_config(const std::string& dialect) {
  // The front end itself, given an empty document: its defaults and derivations, never a copy.
  TrainerConfig config;
  Provenance provenance;
  const DocValue empty = DocValue::map();
  if (dialect == "yaml") {
    translate_yaml(empty, config, provenance);
  } else if (dialect == "toml") {
    translate_toml(empty, config, provenance);
  } else {
    throw ConfigError("dialect: unknown config dialect '" + dialect + "' (expected yaml or toml)");
  }
  config.source_file.clear();
  return config;
}

}  // namespace mixtrain
