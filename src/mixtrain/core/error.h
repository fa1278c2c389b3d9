// Errors the user can fix: a bad config, flag, data file or checkpoint.
//
// Thrown anywhere below the CLI and caught once in main(), which prints the message as one
// line and exits with exit_code(). The message names what is wrong and where (file and key,
// or file and offset). Programming errors stay as c10::Error / std::logic_error.
#pragma once

#include <stdexcept>
#include <string>

namespace mixtrain {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message, int exit_code = 1)
      : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Invalid configuration (file, --set override or flag): exit code 2.
class ConfigError : public UserError {
 public:
  explicit ConfigError(const std::string& message) : UserError(message, 2) {}
};

// Unreadable or malformed data file.
class DataError : public UserError {
 public:
  explicit DataError(const std::string& message) : UserError(message, 1) {}
};

}  // namespace mixtrain
