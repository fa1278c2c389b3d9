// Plain line logging to stderr: "<time> <LEVEL> [rank N] message".
//
// Rank 0 (and single-process runs) print without a rank tag; other ranks tag every line so
// interleaved output stays attributable. Thread-safe; each call writes one whole line.
#pragma once

#include <string>

namespace mixtrain {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_log_rank(int rank);
void set_log_level(LogLevel level);

void log_message(LogLevel level, const std::string& message);
inline void log_debug(const std::string& m) {
  log_message(LogLevel::kDebug, m);
}
inline void log_info(const std::string& m) {
  log_message(LogLevel::kInfo, m);
}
inline void log_warn(const std::string& m) {
  log_message(LogLevel::kWarn, m);
}
inline void log_error(const std::string& m) {
  log_message(LogLevel::kError, m);
}

// Number of warnings logged so far (tests use it to check that a warning was issued).
int warning_count();

}  // namespace mixtrain
