#include "mixtrain/cli/worker_launch.h"

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "mixtrain/core/device.h"
#include "mixtrain/distributed/launcher.h"

namespace mixtrain {

// argv without "--nproc N" / "--nproc=N": what each local worker runs.
std::vector<std::string> worker_argv(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--nproc") {
      ++i;
      continue;
    }
    if (arg.rfind("--nproc=", 0) == 0) continue;
    out.push_back(arg);
  }
  return out;
}

// The workers (MIXTRAIN_LAUNCHED=1) do the work.
bool should_launch(int nproc) {
  return nproc > 1 && std::getenv("MIXTRAIN_LAUNCHED") == nullptr;
}

int launch_data_parallel_workers(const std::string& config_path,
                                 const std::vector<std::string>& overrides, int nproc, int argc,
                                 char** argv) {
  // A config whose degrees do not fill --nproc and leave dp_shard at 1 gets the remaining ranks
  // as its FSDP degree (torchtitan's shard degree -1): N / (dp_replicate x cp x tp). Its
  // validation must see that degree (e.g. parallel.ep must divide dp_shard), so when the config
  // as written fails or needs it, it is resolved again with it; that resolution's error, if
  // any, is the one reported.
  std::vector<std::string> argv_for_workers = worker_argv(argc, argv);
  std::optional<ResolvedConfig> as_written;
  try {
    as_written = load_config(config_path, overrides);
  } catch (const ConfigError&) {
  }
  ResolvedConfig resolved;
  if (as_written && (as_written->config.parallel.world_size() == nproc ||
                     as_written->config.parallel.dp_shard != 1)) {
    resolved = *as_written;
  } else {
    int64_t others = 1;  // dp_replicate x cp x tp as written (1 when it did not resolve)
    if (as_written) {
      const ParallelConfig& p = as_written->config.parallel;
      others = p.dp_replicate * p.cp * p.tp;
    }
    const int64_t shard = nproc % others == 0 ? nproc / others : nproc;
    const bool toml = std::filesystem::path(config_path).extension() == ".toml";
    const std::string set =
        std::string(toml ? "parallelism.data_parallel_shard_degree" : "parallel.dp_shard") + "=" +
        std::to_string(shard);
    std::vector<std::string> with_shard = overrides;
    with_shard.push_back(set);
    resolved = load_config(config_path, with_shard);
    argv_for_workers.push_back("--set");
    argv_for_workers.push_back(set);
  }
  const int64_t world = resolved.config.parallel.world_size();
  if (world != nproc) {
    const Provenance& spelled = resolved.provenance;
    throw ConfigError(resolved.config.source_file + ": parallel: --nproc " + std::to_string(nproc) +
                      " but " + spelled.user_key("parallel.dp_replicate") + " x " +
                      spelled.user_key("parallel.dp_shard") + " x " +
                      spelled.user_key("parallel.cp") + " x " + spelled.user_key("parallel.tp") +
                      " = " + std::to_string(world));
  }
  // Devices the workers cannot have are refused once, here; each worker still probes its own.
  if (resolved.config.train.device == "cuda") {
    in_user_dialect(resolved, [&] {
      try {
        check_cuda_devices(0, nproc);
      } catch (const std::invalid_argument& error) {
        throw ConfigError(ConfigKey{"train.device"}, error.what());
      }
      return 0;
    });
  }
  return launch_local_workers(nproc, argv_for_workers, resolved.config.distributed.timeout_s);
}

}  // namespace mixtrain
