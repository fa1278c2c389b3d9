// What the front-end tests share: a config text written to a temporary file and run through one
// dialect's front end (translate_toml / translate_yaml on the file read back), giving either the
// config with its provenance or the ConfigError message.
#pragma once

#include <functional>
#include <string>

#include "mixtrain/config/provenance.h"
#include "mixtrain/config/trainer_config.h"
#include "unit/config/temp_config.h"

namespace mixtrain::testing {

// A front end run on the file at `path`: reads it and translates it into `config`, recording
// where each key came from in `provenance` (provenance.file is `path`).
using FrontEnd =
    std::function<void(const std::string& path, TrainerConfig& config, Provenance& provenance)>;

struct Translated {
  TrainerConfig config;
  Provenance provenance;
};

// `text` written to <temp dir>/<name> and translated by `front_end`; provenance.file is the
// temporary path (gone on return).
inline Translated translate_file(const std::string& name, const std::string& text,
                                 const FrontEnd& front_end) {
  TempDir dir;
  Translated t;
  t.provenance.file = dir.write(name, text);
  front_end(t.provenance.file, t.config, t.provenance);
  return t;
}

// The ConfigError message `front_end` throws for `text` written to <temp dir>/<name>, without
// the "<path>: " prefix (config_error_of fails the test when it throws none).
inline std::string front_end_error(const std::string& name, const std::string& text,
                                   const FrontEnd& front_end) {
  TempDir dir;
  Provenance provenance;
  provenance.file = dir.write(name, text);
  TrainerConfig config;
  std::string message = config_error_of([&] { front_end(provenance.file, config, provenance); });
  const std::string prefix = provenance.file + ": ";
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}

}  // namespace mixtrain::testing
