// An optimizer's options, each declared once as a field (docs/extending.md "Adding an
// optimizer"): its name, how a config file sets and shows it, its rule, its TOML spelling and
// whether it is a per-group hyper-parameter saved with every param group in checkpoints. From
// one field list come the config section's keys and checks (config_leaves), the options'
// validate(), and the checkpoint round trip (fields_to_json / fields_from_json).
//
// A field is built from an accessor (a generic lambda returning a reference to the value,
// `[](auto& o) -> auto& { return o.momentum(); }`), a codec for its type and an optional rule
// returning "" or what is wrong ("must be >= 0, got -1", shown after the key or name).
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "mixtrain/config/schema.h"
#include "mixtrain/config/section.h"
#include "mixtrain/optim/leaf_optimizer.h"

namespace mixtrain {

template <typename Owner>
struct OptionField {
  std::string name;              // "ns_steps": the hyper-parameter's name
  std::string key;               // its canonical config key
  std::string toml_key;          // LeafSpec::toml_key
  bool toml_by_section = false;  // LeafSpec::toml_by_section
  bool hyperparameter = true;    // saved per param group (fields_to_json)
  std::function<void(Owner&, const DocValue&, const Where&)> read;
  std::function<std::string(const Owner&)> show;
  std::function<std::string(const Owner&)> problem;  // null: no rule
  std::function<nlohmann::json(const Owner&)> to_json;
  std::function<void(Owner&, HyperparameterReader&)> from_json;

  OptionField& toml(std::string spelled, bool by_section = false) {
    toml_key = std::move(spelled);
    toml_by_section = by_section;
    return *this;
  }
  OptionField& not_hyperparameter() {
    hyperparameter = false;
    return *this;
  }
  OptionField& with_key(std::string canonical) {
    key = std::move(canonical);
    return *this;
  }
};

// Codecs: how a value of one type is read from the config and from a checkpoint, and shown.
struct NumberCodec {
  double read(const DocValue& v, const Where& w) const { return read_float(v, w); }
  std::string show(double v) const { return format_number(v); }
  nlohmann::json json(double v) const { return v; }
  double from_json(HyperparameterReader& r, const std::string& n) const { return r.number(n); }
};
struct IntegerCodec {
  int64_t read(const DocValue& v, const Where& w) const { return read_int(v, w); }
  std::string show(int64_t v) const { return std::to_string(v); }
  nlohmann::json json(int64_t v) const { return v; }
  int64_t from_json(HyperparameterReader& r, const std::string& n) const { return r.integer(n); }
};
struct FlagCodec {
  bool read(const DocValue& v, const Where& w) const { return read_bool(v, w); }
  std::string show(bool v) const { return v ? "true" : "false"; }
  nlohmann::json json(bool v) const { return v; }
  bool from_json(HyperparameterReader& r, const std::string& n) const { return r.boolean(n); }
};
struct TextCodec {
  std::string read(const DocValue& v, const Where& w) const { return read_string(v, w); }
  std::string show(const std::string& v) const { return v.empty() ? "\"\"" : v; }
  nlohmann::json json(const std::string& v) const { return v; }
  std::string from_json(HyperparameterReader& r, const std::string& n) const { return r.string(n); }
};
// (a, b): "[0.9, 0.999]".
struct PairCodec {
  std::tuple<double, double> read(const DocValue& v, const Where& w) const {
    const auto pair = read_float_pair(v, w);
    return {pair[0], pair[1]};
  }
  std::string show(const std::tuple<double, double>& v) const {
    return format_pair({std::get<0>(v), std::get<1>(v)});
  }
  nlohmann::json json(const std::tuple<double, double>& v) const {
    return {std::get<0>(v), std::get<1>(v)};
  }
  std::tuple<double, double> from_json(HyperparameterReader& r, const std::string& n) const;
};
// [[a, b, c], ...].
struct TriplesCodec {
  using Triples = std::vector<std::array<double, 3>>;
  Triples read(const DocValue& v, const Where& w) const { return read_float_triples(v, w); }
  std::string show(const Triples& v) const { return format_triples(v); }
  nlohmann::json json(const Triples& v) const;
  Triples from_json(HyperparameterReader& r, const std::string& n) const;
};
struct StringListCodec {
  std::vector<std::string> read(const DocValue& v, const Where& w) const {
    return read_string_list(v, w);
  }
  std::string show(const std::vector<std::string>& v) const { return format_string_list(v); }
  nlohmann::json json(const std::vector<std::string>& v) const { return v; }
  std::vector<std::string> from_json(HyperparameterReader& r, const std::string& n) const;
};
// One of named values (an enum, a dtype): the config and checkpoints hold the name. A
// checkpoint may also hold a `json_only` name (a value the options accept, the config not).
template <typename T>
struct ChoiceCodec {
  std::vector<std::pair<std::string, T>> names;
  std::vector<std::pair<std::string, T>> json_only = {};

  std::string list() const {
    std::string text;
    for (const auto& [name, value] : names) text += (text.empty() ? "" : ", ") + name;
    return text;
  }
  T read(const DocValue& v, const Where& w) const {
    const std::string name = read_string(v, w);
    for (const auto& [candidate, value] : names) {
      if (candidate == name) return value;
    }
    throw_config_error(w, "must be one of " + list() + ", got '" + name + "'");
  }
  std::string show(const T& v) const {
    for (const auto& [name, value] : names) {
      if (value == v) return name;
    }
    for (const auto& [name, value] : json_only) {
      if (value == v) return name;
    }
    return "?";
  }
  nlohmann::json json(const T& v) const { return show(v); }
  T from_json(HyperparameterReader& r, const std::string& n) const {
    const std::string name = r.string(n);
    for (const auto* table : {&names, &json_only}) {
      for (const auto& [candidate, value] : *table) {
        if (candidate == name) return value;
      }
    }
    throw std::invalid_argument("field '" + n + "': unknown value '" + name + "' (expected " +
                                list() + ")");
  }
};

// Rules, as used by option(): "" or the problem with the value.
inline std::string rule_non_negative(double v) {
  return v >= 0 ? "" : "must be >= 0, got " + format_number(v);
}
inline std::string rule_positive(double v) {
  return v > 0 ? "" : "must be > 0, got " + format_number(v);
}
inline std::string rule_unit_interval_open_right(double v) {
  return v >= 0 && v < 1 ? "" : "must be in [0, 1), got " + format_number(v);
}
inline std::function<std::string(const std::string&)> rule_one_of(
    std::vector<std::string> allowed) {
  return [allowed](const std::string& v) -> std::string {
    std::string list;
    for (size_t i = 0; i < allowed.size(); ++i) {
      if (v == allowed[i]) return "";
      list += (i == 0 ? "" : ", ") + allowed[i];
    }
    return "must be one of " + list + ", got '" + v + "'";
  };
}

// A field named `name` (key: set by the section), read and shown by `codec`, checked by `rule`
// (a function of the value; null: none).
template <typename Owner, typename Access, typename Codec, typename Rule = std::nullptr_t>
OptionField<Owner> option(std::string name, Access access, Codec codec, Rule rule = nullptr) {
  OptionField<Owner> field;
  field.name = std::move(name);
  field.read = [access, codec](Owner& o, const DocValue& v, const Where& w) {
    access(o) = codec.read(v, w);
  };
  field.show = [access, codec](const Owner& o) { return codec.show(access(o)); };
  field.to_json = [access, codec](const Owner& o) { return codec.json(access(o)); };
  const std::string n = field.name;
  field.from_json = [access, codec, n](Owner& o, HyperparameterReader& r) {
    access(o) = codec.from_json(r, n);
  };
  if constexpr (!std::is_same_v<Rule, std::nullptr_t>) {
    field.problem = [access, rule](const Owner& o) -> std::string { return rule(access(o)); };
  }
  return field;
}

// The config leaves of `fields`, whose owner is reached from a TrainerConfig by `section`
// (a generic lambda returning a reference to it). Keys are `key_prefix` + name unless a field
// has its own.
template <typename Owner, typename Section>
std::vector<LeafSpec> config_leaves(const std::vector<OptionField<Owner>>& fields,
                                    const std::string& key_prefix, Section section) {
  std::vector<LeafSpec> leaves;
  for (const OptionField<Owner>& field : fields) {
    LeafSpec leaf;
    leaf.key = field.key.empty() ? key_prefix + field.name : field.key;
    leaf.assign = [section, read = field.read](TrainerConfig& c, const DocValue& v,
                                               const Where& w) { read(section(c), v, w); };
    leaf.format = [section, show = field.show](const TrainerConfig& c) { return show(section(c)); };
    if (field.problem) {
      leaf.problem = [section, problem = field.problem](const TrainerConfig& c) {
        return problem(section(c));
      };
    }
    leaf.toml_key = field.toml_key;
    leaf.toml_by_section = field.toml_by_section;
    leaves.push_back(std::move(leaf));
  }
  return leaves;
}

// The first rule `options` break, as "<name> <problem>", or "".
template <typename Owner>
std::string fields_problem(const std::vector<OptionField<Owner>>& fields, const Owner& options) {
  for (const OptionField<Owner>& field : fields) {
    if (!field.problem) continue;
    const std::string problem = field.problem(options);
    if (!problem.empty()) return field.name + " " + problem;
  }
  return "";
}

// The hyper-parameter fields as a JSON object, and back (every one required, nothing else).
template <typename Owner>
nlohmann::json fields_to_json(const std::vector<OptionField<Owner>>& fields, const Owner& o) {
  nlohmann::json out = nlohmann::json::object();
  for (const OptionField<Owner>& field : fields) {
    if (field.hyperparameter) out[field.name] = field.to_json(o);
  }
  return out;
}
template <typename Owner>
void fields_from_json(const std::vector<OptionField<Owner>>& fields, const nlohmann::json& values,
                      Owner& o) {
  HyperparameterReader reader(values);
  for (const OptionField<Owner>& field : fields) {
    if (field.hyperparameter) field.from_json(o, reader);
  }
  reader.finish();
}

}  // namespace mixtrain
