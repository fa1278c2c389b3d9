#include "mixtrain/core/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "mixtrain/core/printable.h"

namespace mixtrain {
namespace {

std::atomic<int> g_rank{0};
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_warnings{0};
std::mutex g_mutex;

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO ";
    case LogLevel::kWarn:
      return "WARN ";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?";
}

}  // namespace

void set_log_rank(int rank) {
  g_rank = rank;
}
void set_log_level(LogLevel level) {
  g_level = static_cast<int>(level);
}
int warning_count() {
  return g_warnings.load();
}

void log_message(LogLevel level, const std::string& message) {
  if (level == LogLevel::kWarn) ++g_warnings;
  if (static_cast<int>(level) < g_level.load()) return;
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm_now{};
  localtime_r(&now, &tm_now);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm_now);
  std::string rank_tag;
  if (g_rank.load() != 0) rank_tag = "[rank " + std::to_string(g_rank.load()) + "] ";
  std::lock_guard<std::mutex> lock(g_mutex);
  // Messages may quote file contents (checkpoint keys, config values): never raw bytes.
  const std::string text = printable(message, /*keep_newlines=*/true);
  std::fprintf(stderr, "%s %s %s%s\n", stamp, level_name(level), rank_tag.c_str(), text.c_str());
  std::fflush(stderr);
}

}  // namespace mixtrain
