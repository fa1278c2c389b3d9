#include "mixtrain/config/load.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "mixtrain/config/document.h"
#include "mixtrain/config/schema.h"
#include "mixtrain/config/section.h"
#include "mixtrain/config/toml_front_end.h"
#include "mixtrain/config/toml_reader.h"
#include "mixtrain/config/validate.h"
#include "mixtrain/config/yaml_front_end.h"
#include "mixtrain/config/yaml_reader.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/text.h"

namespace mixtrain {
namespace {

enum class Dialect { kYaml, kToml };

Dialect dialect_of(const std::string& path) {
  if (ends_with(path, ".yaml") || ends_with(path, ".yml")) return Dialect::kYaml;
  if (ends_with(path, ".toml")) return Dialect::kToml;
  throw ConfigError(path + ": unknown config format (expected a .yaml, .yml or .toml file)");
}

// Overrides name keys of the file's own dialect; they are checked here, before being applied,
// so a misspelt --set key is reported as such rather than as a file error.
void apply_overrides(DocValue& document, const std::vector<std::string>& overrides,
                     const std::vector<std::string>& valid_keys,
                     const std::function<std::string(const std::string&)>& translate,
                     const std::string& file) {
  for (const std::string& text : overrides) {
    const Override override = split_override(text);
    const Where where{"--set", override.key};
    if (std::find(valid_keys.begin(), valid_keys.end(), override.key) == valid_keys.end()) {
      throw_unknown_key("--set", override.key, DocValue(), valid_keys, translate);
    }
    DocValue value = parse_yaml_value(override.raw_value, where);
    value.from_override = true;
    set_dotted(document, override.key, std::move(value), file);
  }
}

}  // namespace

ResolvedConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  const Dialect dialect = dialect_of(path);
  DocValue document = dialect == Dialect::kYaml ? read_yaml_file(path) : read_toml_file(path);
  if (dialect == Dialect::kYaml) {
    apply_overrides(document, overrides, yaml_keys(), canonical_key_for, path);
  } else {
    apply_overrides(document, overrides, toml_keys(), toml_key_for, path);
  }

  ResolvedConfig resolved;
  Provenance provenance;
  provenance.file = path;
  if (dialect == Dialect::kYaml) {
    translate_yaml(document, resolved.config, provenance);
  } else {
    translate_toml(document, resolved.config, provenance);
  }
  // Keys the sections fill from elsewhere (the model's config.json: model/hf_config.h).
  for (const ConfigSectionSpec& section : config_sections()) {
    if (section.resolve) section.resolve(resolved.config, provenance);
  }
  validate_config(resolved.config, provenance);

  for (const LeafSpec& spec : canonical_leaves()) {
    ResolvedLeaf leaf{spec.key, spec.format(resolved.config), provenance.source(spec.key), ""};
    const auto note = provenance.notes.find(spec.key);
    if (note != provenance.notes.end()) {
      leaf.origin = note->second;
    } else if (provenance.user_key(spec.key) != spec.key) {
      leaf.origin = provenance.user_key(spec.key);
    }
    resolved.leaves.push_back(std::move(leaf));
  }
  resolved.provenance = std::move(provenance);
  return resolved;
}

}  // namespace mixtrain
