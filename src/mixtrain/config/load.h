// Entry point of the config subsystem: file (+ --set overrides) -> validated TrainerConfig.
//
// The dialect comes from the extension (.yaml/.yml: hyper-parallel keys, canonical; .toml:
// torchtitan-npu keys). Overrides "a.b.c=value" use the file's own key names and a YAML value
// ("3", "[0.9,0.95]"). Everything is validated before the call returns, so nothing (model,
// process group, file) exists yet when a config is refused. Any problem throws ConfigError
// (exit code 2) with one line "<file or --set>: <key>: <what is wrong>".
#pragma once

#include <string>
#include <vector>

#include "mixtrain/config/provenance.h"
#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

struct ResolvedLeaf {
  std::string key;  // canonical dotted path, e.g. "train.lr_scheduler.decay"
  std::string value;
  ValueSource source;
  // The key as written when the dialect spells it differently (TOML), or what a derived value
  // was derived from; empty otherwise.
  std::string origin;
};

struct ResolvedConfig {
  TrainerConfig config;
  std::vector<ResolvedLeaf> leaves;  // every leaf of the tree, in canonical order
  // Where each key came from and how the user spelled it: renders the keyed UserErrors of the
  // build steps in the user's dialect (format_user_error). Empty for a config built in code.
  Provenance provenance;

  // The leaf named `key`, or null.
  const ResolvedLeaf* leaf(const std::string& key) const {
    for (const ResolvedLeaf& candidate : leaves) {
      if (candidate.key == key) return &candidate;
    }
    return nullptr;
  }
};

ResolvedConfig load_config(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace mixtrain
