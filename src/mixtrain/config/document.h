// A parsed config document, independent of its dialect: a tree of maps, lists and scalars.
//
// Both readers (YAML, TOML) produce this tree and --set overrides are applied to it before a
// front end translates it into TrainerConfig, so type checks, overrides and key suggestions
// are written once. Every error thrown from here is a ConfigError of the form
// "<origin>: <key>: <message>", where origin is the file path or "--set".
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain {

struct DocValue {
  enum class Kind { kNull, kBool, kInt, kFloat, kString, kList, kMap };

  Kind kind = Kind::kNull;
  bool bool_value = false;
  int64_t int_value = 0;
  double float_value = 0.0;
  std::string string_value;
  std::vector<DocValue> items;                            // kList
  std::vector<std::pair<std::string, DocValue>> entries;  // kMap, in document order
  bool from_override = false;                             // set by --set, not by the file

  static DocValue map() {
    DocValue v;
    v.kind = Kind::kMap;
    return v;
  }
  bool is_map() const { return kind == Kind::kMap; }
  // The entry named `key` of a map, or nullptr.
  const DocValue* find(const std::string& key) const;
  DocValue* find(const std::string& key);
  // "integer 3", "string 'abc'", "a list of 2 items", ...: for "expected X, got Y" messages.
  std::string describe() const;
};

// Where a value came from, for error messages: origin is the file path or "--set".
struct Where {
  std::string origin;
  std::string key;
};

[[noreturn]] void throw_config_error(const Where& where, const std::string& message);

// Typed reads. Integers are accepted where a float is expected; a float is accepted where an
// integer is expected only when it has no fraction (1e3, not 2.5). Non-finite floats are errors.
bool read_bool(const DocValue& v, const Where& where);
int64_t read_int(const DocValue& v, const Where& where);
double read_float(const DocValue& v, const Where& where);
std::string read_string(const DocValue& v, const Where& where);
std::array<double, 2> read_float_pair(const DocValue& v, const Where& where);
std::vector<std::array<double, 3>> read_float_triples(const DocValue& v, const Where& where);
std::vector<std::string> read_string_list(const DocValue& v, const Where& where);

// One "--set key=value" before its value is parsed. Throws on a missing '=' or empty key.
struct Override {
  std::string key;
  std::string raw_value;
};
Override split_override(const std::string& text);

// Puts `value` at the dotted `key`, creating maps on the way (a null section becomes a map).
// `file` names the document in the error raised when the path runs through a non-map value.
void set_dotted(DocValue& root, const std::string& key, DocValue value, const std::string& file);

// The candidate closest to `key` by edit distance (optimal string alignment), or "" if none.
std::string closest_key(const std::string& key, const std::vector<std::string>& candidates);

// "<origin>: <key>: unknown key (did you mean <closest valid key>?)". When `value` is a map (a
// misspelt section) the key is extended to its first leaf, so it reads as a full key.
// `translate` maps a key of the other dialect to this one's ("" if none): a YAML key in a TOML
// file is answered with its TOML spelling rather than with the nearest string.
[[noreturn]] void throw_unknown_key(
    const std::string& origin, const std::string& key, const DocValue& value,
    const std::vector<std::string>& valid,
    const std::function<std::string(const std::string&)>& translate = nullptr);

}  // namespace mixtrain
