#include "mixtrain/distributed/rendezvous.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

int parse_int(const char* name, const char* text, long min_value, long max_value) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') {
    throw ConfigError(std::string(name) + ": expected an integer, got '" + text + "'");
  }
  if (value < min_value || value > max_value) {
    throw ConfigError(std::string(name) + ": must be in [" + std::to_string(min_value) + ", " +
                      std::to_string(max_value) + "], got " + text);
  }
  return static_cast<int>(value);
}

// One launcher's (rank, size, local rank) variables: all present or none.
struct LauncherVars {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;  // optional
  const char* local_size;  // optional; nullptr: the launcher has none
};

bool read_launcher(const LauncherVars& vars, RankInfo& info) {
  const char* rank_text = env(vars.rank);
  const char* size_text = env(vars.size);
  if (rank_text == nullptr && size_text == nullptr) return false;
  if (rank_text == nullptr || size_text == nullptr) {
    const char* missing = rank_text == nullptr ? vars.rank : vars.size;
    const char* present = rank_text == nullptr ? vars.size : vars.rank;
    throw ConfigError(std::string(missing) + ": not set, but " + present + " is (" + vars.launcher +
                      " launch)");
  }
  constexpr long kMax = std::numeric_limits<int>::max();
  info.world_size = parse_int(vars.size, size_text, 1, kMax);
  info.rank = parse_int(vars.rank, rank_text, 0, kMax);
  if (info.rank >= info.world_size) {
    throw ConfigError(std::string(vars.rank) + ": rank " + rank_text + " is not below " +
                      vars.size + " = " + size_text);
  }
  if (const char* local = env(vars.local_rank)) {
    info.local_rank = parse_int(vars.local_rank, local, 0, info.world_size - 1);
  }
  info.local_world_size = info.local_rank + 1;
  if (const char* local_size = vars.local_size != nullptr ? env(vars.local_size) : nullptr) {
    info.local_world_size = parse_int(vars.local_size, local_size, 1, info.world_size);
    if (info.local_rank >= info.local_world_size) {
      throw ConfigError(std::string(vars.local_rank) + ": local rank " +
                        std::to_string(info.local_rank) + " is not below " + vars.local_size +
                        " = " + local_size);
    }
  }
  info.launcher = vars.launcher;
  return true;
}

}  // namespace

RankInfo detect_rank_info() {
  RankInfo info;
  const char* launched = env(kLaunchedEnv);
  const LauncherVars candidates[] = {
      {launched != nullptr ? "mixtrain" : "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK",
       "LOCAL_WORLD_SIZE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
  };
  for (const LauncherVars& vars : candidates) {
    if (read_launcher(vars, info)) break;
  }
  if (const char* addr = env("MASTER_ADDR")) info.master_addr = addr;
  if (const char* port = env("MASTER_PORT"))
    info.master_port = parse_int("MASTER_PORT", port, 1, 65535);
  return info;
}

}  // namespace mixtrain
