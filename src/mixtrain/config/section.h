// Sections that components own (docs/architecture.md §4): an optimizer registers its options
// struct with its keys, checks, TOML spellings and start-up notes; config/ stores, reads,
// checks and prints them without knowing which component they belong to.
//
// A section's values live in a SectionValues (section_values.h), so a TrainerConfig built in
// code holds every section at its defaults. The
// registry must be filled before the first config is read (canonical_leaves() freezes it):
// the binary's main and the test mains call their layer's register function once.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "mixtrain/config/document.h"
#include "mixtrain/config/provenance.h"
#include "mixtrain/config/section_values.h"

namespace mixtrain {

struct TrainerConfig;

// What a check may do: ConfigErrors naming the key as the user wrote it.
class ConfigChecker {
 public:
  virtual ~ConfigChecker() = default;
  [[noreturn]] virtual void fail(const std::string& key, const std::string& rule) const = 0;
  // `rule` + ", got <the value as the config shows it>".
  [[noreturn]] virtual void fail_value(const std::string& key, const std::string& rule) const = 0;
  virtual void positive(const std::string& key, double value) const = 0;
  virtual void non_negative(const std::string& key, double value) const = 0;
  // Whether the user gave `key` (file, --set, or derived from a key they gave).
  virtual bool was_set(const std::string& key) const = 0;
  // Another key named inside a rule, spelled as the user's dialect spells it.
  virtual std::string key(const std::string& canonical) const = 0;
};

// One leaf of the tree: its canonical dotted key, a typed setter and a formatter.
struct LeafSpec {
  std::string key;
  bool settable = true;  // false: set only by the loader, never from a file or --set
  std::function<void(TrainerConfig&, const DocValue&, const Where&)> assign;  // type-checked
  std::function<std::string(const TrainerConfig&)> format;
  // The leaf's own rule: "" when the value is fine, else the whole message ("must be >= 0,
  // got -1"). Null: no rule of its own.
  std::function<std::string(const TrainerConfig&)> problem;
  // TOML: the key a torchtitan-style file sets it with when it is a plain rename ("" if none),
  // and whether a section's translate_toml reads it instead of the plain rename.
  std::string toml_key;
  bool toml_by_section = false;
};

// The keys of a TOML document, for a section's translate_toml.
class TomlInput {
 public:
  virtual ~TomlInput() = default;
  virtual const DocValue* find(const std::string& toml_key) const = 0;
  virtual Where where(const std::string& toml_key) const = 0;
  virtual ValueSource source(const std::string& toml_key) const = 0;
};

// Provenance of a value a TOML key set, and of one derived from other keys.
void record_toml(Provenance& provenance, const std::string& canonical, ValueSource source,
                 const std::string& toml_key);
void record_derived(Provenance& provenance, const std::string& canonical, const std::string& note);

struct ConfigSectionSpec {
  std::string name;  // for messages: the component's name
  // Where its leaves go in the canonical order: "model" (after model.attention_bias, a model
  // family's own keys), "optimizer" (after optimizer.fp32_main_params); "" for a section
  // without leaves.
  std::string slot;
  // The optimizer._target_ value that selects it ("" for none), and whether the TOML dialect
  // offers it.
  std::string target;
  bool in_toml_dialect = true;
  bool default_target = false;   // optimizer._target_ when no config names one
  std::vector<LeafSpec> leaves;  // in display order
  // Fills keys from elsewhere after the front end, before validation (a model's config.json:
  // model.hf_config), recording where each came from (null: nothing to do).
  std::function<void(TrainerConfig&, Provenance&)> resolve;
  // Rules across keys, after every leaf's own rule (null: none).
  std::function<void(const TrainerConfig&, const ConfigChecker&)> check;
  // Lines the loader logs as warnings, and `config show` notes (null: none).
  std::function<std::vector<std::string>(const TrainerConfig&)> warnings;
  std::function<std::vector<std::string>(const TrainerConfig&)> notes;
  // TOML dialect: its defaults where they differ, the TOML keys it reads itself (beyond its
  // leaves' toml_key), and the translation that reads them, run after every plain rename.
  std::function<void(TrainerConfig&)> toml_defaults;
  std::vector<std::string> toml_keys;
  std::function<void(const TomlInput&, TrainerConfig&, Provenance&)> translate_toml;
};

// Registers a section; throws std::logic_error for a second section of the same name or a
// key already taken, or once the leaves were read (canonical_leaves()).
void register_config_section(ConfigSectionSpec spec);
// Every registered section, in registration order.
const std::vector<ConfigSectionSpec>& config_sections();
// The sections whose target is set, sorted by target: the optimizer._target_ values.
std::vector<std::string> section_targets(bool toml_dialect);
// (default_optimizer_target, trainer_config.h: the target of the default_target section.)

}  // namespace mixtrain
