// Errors the user can fix: a bad config, flag, data file or checkpoint.
//
// Thrown anywhere below the CLI and caught once in main(), which prints the message as one
// line and exits with exit_code(). The message names what is wrong and where (file and key,
// or file and offset). Programming errors stay as c10::Error / std::logic_error.
//
// Config keys in messages (issue 14.3). config/validate.cpp refuses everything it can decide
// from the config alone, in the user's dialect. What only a build step can refuse (a name only
// the model registry or optimizer table knows, a built model's shape, a data file, a directory)
// is thrown by the layer that maps the config to that component, as UserError(ConfigKey{key},
// problem): `key` is the canonical key ("parallel.ep"), `problem` the message without any key
// name. what() then reads "<key>: <problem>"; the CLI renders it through the run's Provenance
// as "<file or --set>: <key as the user wrote it>: <problem>" (config/provenance.h). Classes
// that take plain values (LrSchedule, DeviceMesh, the models' shapes) check their invariants
// with std::invalid_argument / TORCH_CHECK and never name a config key.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace mixtrain {

// The canonical config key an error is about ("data.path", "optimizer._target_").
struct ConfigKey {
  std::string canonical;
};

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message, int exit_code = 1)
      : std::runtime_error(message), exit_code_(exit_code), problem_(message) {}
  UserError(ConfigKey key, const std::string& problem, int exit_code = 1)
      : std::runtime_error(key.canonical + ": " + problem),
        exit_code_(exit_code),
        key_(std::move(key.canonical)),
        problem_(problem) {}
  int exit_code() const { return exit_code_; }
  // The canonical key the error is about; empty when the message is already complete.
  const std::string& key() const { return key_; }
  // The message without the key (what() itself when key() is empty).
  const std::string& problem() const { return problem_; }

 private:
  int exit_code_;
  std::string key_;
  std::string problem_;
};

// Invalid configuration (file, --set override or flag): exit code 2.
class ConfigError : public UserError {
 public:
  explicit ConfigError(const std::string& message) : UserError(message, 2) {}
  ConfigError(ConfigKey key, const std::string& problem) : UserError(std::move(key), problem, 2) {}
};

// Unreadable or malformed data file.
class DataError : public UserError {
 public:
  explicit DataError(const std::string& message) : UserError(message, 1) {}
  DataError(ConfigKey key, const std::string& problem) : UserError(std::move(key), problem, 1) {}
};

}  // namespace mixtrain
