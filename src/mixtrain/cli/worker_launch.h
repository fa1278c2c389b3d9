// What the commands that run on data-parallel ranks share (`train`, `eval`, `optim-replay`):
// `--nproc N` starts N local workers running the same command line, and a build step's keyed
// UserError is reported in the user's dialect.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/load.h"
#include "mixtrain/config/provenance.h"
#include "mixtrain/core/error.h"

namespace mixtrain {

// argv without "--nproc N" / "--nproc=N": what each local worker runs.
std::vector<std::string> worker_argv(int argc, char** argv);

// `--nproc N` (N > 1) in the launching process (not in a worker, MIXTRAIN_LAUNCHED unset).
bool should_launch(int nproc);

// Validates the config once, here, and starts N workers; returns their exit code. A config
// without data-parallel degrees runs as N-way FSDP (torchtitan's shard degree -1): its
// validation must see that degree (e.g. parallel.ep must divide dp_shard), so when the config as
// written fails or has dp_replicate x dp_shard = 1, it is resolved again with dp_shard = N (and
// the workers get that --set); that resolution's error, if any, is the one reported. Degrees
// whose product is not N, and CUDA devices the workers cannot have, are ConfigErrors.
int launch_data_parallel_workers(const std::string& config_path,
                                 const std::vector<std::string>& overrides, int nproc, int argc,
                                 char** argv);

// Runs `body` on a loaded config. A UserError carrying a canonical key (thrown by a build step,
// core/error.h) is rethrown with the key as the user wrote it and where: "<file or --set>:
// <key>: <problem>" (config/provenance.h format_user_error); the exit code stays.
template <typename Body>
int in_user_dialect(const ResolvedConfig& resolved, Body&& body) {
  try {
    return body();
  } catch (const UserError& error) {
    if (error.key().empty()) throw;
    throw UserError(format_user_error(error, resolved.provenance), error.exit_code());
  }
}

}  // namespace mixtrain
