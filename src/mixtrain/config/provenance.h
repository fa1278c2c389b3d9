// Where each resolved leaf came from: its source (default / file / --set / derived), the key
// the user actually wrote for it (TOML keys differ from canonical keys) and, for derived
// leaves, a short note on what they were derived from. Error messages and `config show` use it.
// The readers keep no line numbers, so neither does Provenance: errors name file and key only.
#pragma once

#include <map>
#include <string>

#include "mixtrain/core/error.h"

namespace mixtrain {

enum class ValueSource { kDefault, kFile, kOverride, kDerived };

// "default" | "file" | "--set" | "derived"
const char* value_source_name(ValueSource source);

struct Provenance {
  std::string file;                               // the config file path
  std::map<std::string, ValueSource> sources;     // canonical key -> source; absent: default
  std::map<std::string, std::string> spelled_as;  // canonical key -> key as written (TOML)
  std::map<std::string, std::string> notes;       // canonical key -> "from optimizer.lr", ...

  ValueSource source(const std::string& key) const;
  // "--set" when the key's value came from an override, else the file path.
  std::string origin_of(const std::string& key) const;
  // The key as the user spelled it in the file's dialect (canonical key if none).
  std::string user_key(const std::string& key) const;
};

// A UserError carrying a canonical key (core/error.h) as "<origin_of(key)>: <user_key(key)>:
// <problem>"; any other error's message unchanged.
std::string format_user_error(const UserError& error, const Provenance& provenance);

}  // namespace mixtrain
