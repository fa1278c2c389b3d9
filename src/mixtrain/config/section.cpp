#include "mixtrain/config/section.h"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace mixtrain {
namespace {

struct Registry {
  std::vector<ConfigSectionSpec> sections;
  bool frozen = false;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

// Called by canonical_leaves() (schema.cpp) when it builds the leaf list.
void freeze_config_sections() {
  registry().frozen = true;
}

void record_toml(Provenance& provenance, const std::string& canonical, ValueSource source,
                 const std::string& toml_key) {
  provenance.sources[canonical] = source;
  provenance.spelled_as[canonical] = toml_key;
}

void record_derived(Provenance& provenance, const std::string& canonical, const std::string& note) {
  provenance.sources[canonical] = ValueSource::kDerived;
  provenance.notes[canonical] = note;
}

void register_config_section(ConfigSectionSpec spec) {
  Registry& r = registry();
  if (r.frozen) {
    throw std::logic_error("config section '" + spec.name +
                           "' registered after the config leaves were read");
  }
  std::set<std::string> keys;
  for (const ConfigSectionSpec& other : r.sections) {
    if (other.name == spec.name) {
      throw std::logic_error("config section '" + spec.name + "' registered twice");
    }
    for (const LeafSpec& leaf : other.leaves) keys.insert(leaf.key);
  }
  for (const LeafSpec& leaf : spec.leaves) {
    if (!keys.insert(leaf.key).second) {
      throw std::logic_error("config section '" + spec.name + "': key " + leaf.key +
                             " is registered twice");
    }
  }
  r.sections.push_back(std::move(spec));
}

const std::vector<ConfigSectionSpec>& config_sections() {
  return registry().sections;
}

std::string default_optimizer_target() {
  for (const ConfigSectionSpec& section : config_sections()) {
    if (section.default_target) return section.target;
  }
  return "";
}

std::vector<std::string> section_targets(bool toml_dialect) {
  std::vector<std::string> targets;
  for (const ConfigSectionSpec& section : config_sections()) {
    if (!section.target.empty() && (section.in_toml_dialect || !toml_dialect)) {
      targets.push_back(section.target);
    }
  }
  std::sort(targets.begin(), targets.end());
  return targets;
}

}  // namespace mixtrain
