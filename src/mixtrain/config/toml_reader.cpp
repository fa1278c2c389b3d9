#include "mixtrain/config/toml_reader.h"

#include <fstream>
#include <map>
#include <sstream>
#include <toml.hpp>
#include <vector>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace {

// std::map tables: deterministic order, so the first error reported never depends on hashing.
using TomlValue = toml::basic_value<toml::discard_comments, std::map, std::vector>;

DocValue toml_to_doc(const TomlValue& value, const Where& where) {
  DocValue v;
  switch (value.type()) {
    case toml::value_t::boolean:
      v.kind = DocValue::Kind::kBool;
      v.bool_value = value.as_boolean();
      return v;
    case toml::value_t::integer:
      v.kind = DocValue::Kind::kInt;
      v.int_value = value.as_integer();
      return v;
    case toml::value_t::floating:
      v.kind = DocValue::Kind::kFloat;
      v.float_value = value.as_floating();
      return v;
    case toml::value_t::string:
      v.kind = DocValue::Kind::kString;
      v.string_value = value.as_string().str;
      return v;
    case toml::value_t::array:
      v.kind = DocValue::Kind::kList;
      for (const TomlValue& item : value.as_array()) v.items.push_back(toml_to_doc(item, where));
      return v;
    case toml::value_t::table:
      v = DocValue::map();
      for (const auto& entry : value.as_table()) {
        const std::string path = where.key.empty() ? entry.first : where.key + "." + entry.first;
        v.entries.emplace_back(entry.first, toml_to_doc(entry.second, {where.origin, path}));
      }
      return v;
    default:
      throw_config_error(where, "dates and times are not accepted by any key (line " +
                                    std::to_string(value.location().line()) + ")");
  }
}

// toml11's messages span several lines; keep the first without its "[error] toml::fn: " prefix.
std::string first_line_of(const std::string& message) {
  std::string line = message.substr(0, message.find('\n'));
  const std::string error_tag = "[error] ";
  if (line.compare(0, error_tag.size(), error_tag) == 0) line = line.substr(error_tag.size());
  if (line.compare(0, 6, "toml::") == 0) {
    const size_t colon = line.find(": ");
    if (colon != std::string::npos) line = line.substr(colon + 2);
  }
  return line;
}

}  // namespace

DocValue read_toml_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open the config file (missing or unreadable)");
  TomlValue root;
  try {
    root = toml::parse<toml::discard_comments, std::map, std::vector>(in, path);
  } catch (const toml::exception& e) {
    throw ConfigError(path + ": line " + std::to_string(e.location().line()) +
                      ": TOML syntax error: " + first_line_of(e.what()));
  } catch (const std::exception& e) {
    throw ConfigError(path + ": TOML syntax error: " + first_line_of(e.what()));
  }
  return toml_to_doc(root, {path, ""});
}

}  // namespace mixtrain
