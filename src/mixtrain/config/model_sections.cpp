#include "mixtrain/config/model_sections.h"

#include <stdexcept>

namespace mixtrain {
namespace {

struct ModelSectionRegistry {
  std::vector<ModelSection> sections;
  std::string default_name;
};

ModelSectionRegistry& model_section_registry() {
  static ModelSectionRegistry instance;
  return instance;
}

}  // namespace

void register_model_section(ModelSection section, bool is_default) {
  ModelSectionRegistry& r = model_section_registry();
  for (const ModelSection& other : r.sections) {
    if (other.name == section.name) {
      throw std::logic_error("model section '" + section.name + "' registered twice");
    }
  }
  if (is_default && r.default_name.empty()) r.default_name = section.name;
  r.sections.push_back(std::move(section));
}

const std::vector<ModelSection>& model_sections() {
  return model_section_registry().sections;
}

std::string default_model_name() {
  return model_section_registry().default_name;
}

const ModelSection* find_model_section(const std::string& name) {
  for (const auto& section : model_sections()) {
    if (section.name == name) return &section;
  }
  return nullptr;
}

bool model_reads_key(const std::string& model_name, const std::string& key) {
  bool someones = false;
  for (const auto& section : model_sections()) {
    for (const std::string& own : section.own_keys) {
      if (own != key) continue;
      if (section.name == model_name) return true;
      someones = true;
    }
  }
  return !someones;
}

}  // namespace mixtrain
