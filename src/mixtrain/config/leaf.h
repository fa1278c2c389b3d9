// Typed leaves of the config tree (section.h LeafSpec) over one field: read_into and display
// per field type, and field_leaf(key, access) which a component uses for its own fields
// (schema.cpp for the keys every run has, a model family for its own keys). Names no component.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/document.h"
#include "mixtrain/config/section.h"
#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

// Type-checked reads of a document value into a field (UserError naming `w` otherwise).
void read_into(bool& out, const DocValue& v, const Where& w);
void read_into(int64_t& out, const DocValue& v, const Where& w);
void read_into(double& out, const DocValue& v, const Where& w);
void read_into(std::string& out, const DocValue& v, const Where& w);
void read_into(std::optional<std::string>& out, const DocValue& v, const Where& w);
void read_into(std::array<double, 2>& out, const DocValue& v, const Where& w);
void read_into(std::vector<std::array<double, 3>>& out, const DocValue& v, const Where& w);
void read_into(std::vector<std::string>& out, const DocValue& v, const Where& w);

// A field's value as `config show` prints it.
std::string display(bool v);
std::string display(int64_t v);
std::string display(double v);
std::string display(const std::string& v);
std::string display(const std::optional<std::string>& v);
std::string display(const std::array<double, 2>& v);
std::string display(const std::vector<std::array<double, 3>>& v);
std::string display(const std::vector<std::string>& v);

// The leaf `key` over the field `access(config)` returns: `access` is a generic lambda returning
// a reference to the field, so one lambda serves both the setter and the formatter.
template <typename Access>
LeafSpec field_leaf(std::string key, Access access, bool settable = true) {
  LeafSpec spec;
  spec.key = std::move(key);
  spec.settable = settable;
  spec.assign = [access](TrainerConfig& c, const DocValue& v, const Where& w) {
    read_into(access(c), v, w);
  };
  spec.format = [access](const TrainerConfig& c) { return display(access(c)); };
  return spec;
}

}  // namespace mixtrain
