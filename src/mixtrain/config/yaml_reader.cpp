#include "mixtrain/config/yaml_reader.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace {

DocValue typed_plain_scalar(const std::string& text, const Where& where) {
  static const std::regex kInt("[-+]?[0-9]+");
  static const std::regex kFloat("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
  DocValue v;
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") return v;
  if (text == "true" || text == "True" || text == "TRUE" || text == "false" || text == "False" ||
      text == "FALSE") {
    v.kind = DocValue::Kind::kBool;
    v.bool_value = text[0] == 't' || text[0] == 'T';
    return v;
  }
  if (std::regex_match(text, kInt)) {
    errno = 0;
    v.kind = DocValue::Kind::kInt;
    v.int_value = std::strtoll(text.c_str(), nullptr, 10);
    if (errno == ERANGE) throw_config_error(where, "integer " + text + " is out of range");
    return v;
  }
  if (std::regex_match(text, kFloat)) {
    v.kind = DocValue::Kind::kFloat;
    v.float_value = std::strtod(text.c_str(), nullptr);
    return v;
  }
  const std::string lower = [&] {
    std::string s = text;
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }();
  if (lower == ".inf" || lower == "+.inf" || lower == "-.inf" || lower == ".nan") {
    v.kind = DocValue::Kind::kFloat;
    v.float_value = lower == ".nan"   ? std::numeric_limits<double>::quiet_NaN()
                    : lower[0] == '-' ? -std::numeric_limits<double>::infinity()
                                      : std::numeric_limits<double>::infinity();
    return v;
  }
  v.kind = DocValue::Kind::kString;
  v.string_value = text;
  return v;
}

DocValue yaml_to_doc(const YAML::Node& node, const Where& where) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return DocValue();
    case YAML::NodeType::Scalar: {
      // "!" is the tag of a quoted scalar: always a string, never a number or a bool.
      if (node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str") {
        DocValue v;
        v.kind = DocValue::Kind::kString;
        v.string_value = node.Scalar();
        return v;
      }
      return typed_plain_scalar(node.Scalar(), where);
    }
    case YAML::NodeType::Sequence: {
      DocValue v;
      v.kind = DocValue::Kind::kList;
      for (const YAML::Node& item : node) v.items.push_back(yaml_to_doc(item, where));
      return v;
    }
    case YAML::NodeType::Map: {
      DocValue v = DocValue::map();
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) throw_config_error(where, "mapping keys must be plain names");
        const std::string key = entry.first.Scalar();
        const std::string path = where.key.empty() ? key : where.key + "." + key;
        if (v.find(key) != nullptr) {
          throw_config_error(
              {where.origin, path},
              "duplicate key (line " + std::to_string(entry.first.Mark().line + 1) + ")");
        }
        v.entries.emplace_back(key, yaml_to_doc(entry.second, {where.origin, path}));
      }
      return v;
    }
  }
  return DocValue();
}

}  // namespace

DocValue read_yaml_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the config file (missing or unreadable)");
  std::stringstream text;
  text << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    throw ConfigError(path + ": line " + std::to_string(e.mark.line + 1) + ", column " +
                      std::to_string(e.mark.column + 1) + ": YAML syntax error: " + e.msg);
  }
  if (root.IsNull() || !root.IsDefined()) return DocValue::map();
  if (!root.IsMap()) {
    throw ConfigError(path + ": the top level must be a mapping of keys (e.g. 'optimizer:')");
  }
  return yaml_to_doc(root, {path, ""});
}

DocValue parse_yaml_value(const std::string& text, const Where& where) {
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw_config_error(where, "cannot parse value '" + text + "': " + e.msg);
  }
  return yaml_to_doc(node, where);
}

}  // namespace mixtrain
