#include "mixtrain/config/yaml_front_end.h"

#include <set>

#include "mixtrain/config/schema.h"
#include "mixtrain/config/toml_front_end.h"

namespace mixtrain {
namespace {

// The seed names optimizers by their Python class path; only the class name matters here.
const char kSeedOptimizerPackage[] =
    "hyper_parallel.auto_models.components.optim.optimizer.optimizer.";

const std::set<std::string>& yaml_sections() {
  static const std::set<std::string> sections = [] {
    std::set<std::string> result;
    for (const std::string& key : yaml_keys()) {
      for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) {
        result.insert(key.substr(0, dot));
      }
    }
    return result;
  }();
  return sections;
}

void walk(const DocValue& map, const std::string& prefix, TrainerConfig& config,
          Provenance& provenance) {
  for (const auto& [name, value] : map.entries) {
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    const std::string origin = value.from_override ? "--set" : provenance.file;
    const LeafSpec* leaf = find_canonical_leaf(path);
    if (leaf != nullptr && leaf->settable) {
      leaf->assign(config, value, {origin, path});
      provenance.sources[path] = value.from_override ? ValueSource::kOverride : ValueSource::kFile;
    } else if (yaml_sections().count(path) > 0) {
      if (value.is_map()) {
        walk(value, path, config, provenance);
      } else if (value.kind != DocValue::Kind::kNull) {
        throw_config_error({origin, path}, "expected a mapping of keys, got " + value.describe());
      }
    } else {
      throw_unknown_key(origin, path, value, yaml_keys(), canonical_key_for);
    }
  }
}

}  // namespace

const std::vector<std::string>& yaml_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> result;
    for (const LeafSpec& spec : canonical_leaves()) {
      if (spec.settable) result.push_back(spec.key);
    }
    return result;
  }();
  return keys;
}

void translate_yaml(const DocValue& document, TrainerConfig& config, Provenance& provenance) {
  walk(document, "", config, provenance);

  std::string& target = config.optimizer.target;
  if (target.rfind(kSeedOptimizerPackage, 0) == 0) {
    target = target.substr(sizeof(kSeedOptimizerPackage) - 1);
  }

  config.dialect = "yaml";
  config.source_file = provenance.file;
  config.optimizer.routing = "yaml";
  for (const char* key : {"dialect", "source_file", "optimizer.routing"}) {
    provenance.sources[key] = ValueSource::kDerived;
  }
  provenance.notes["dialect"] = "file extension";
  provenance.notes["optimizer.routing"] = "YAML dialect";
}

}  // namespace mixtrain
