// The benchmarks' local multi-process runs: N worker processes of this binary on loopback Gloo.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "mixtrain/distributed/launcher.h"

namespace mixtrain::bench {

// One spec per rank for n local workers (argv[0] = `name`): the torchrun variables (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR 127.0.0.1, MASTER_PORT a free port), MIXTRAIN_LAUNCHED,
// one intra-op thread, plus `env`; rank r's output goes to log_prefix + r + ".log".
inline std::vector<mixtrain::WorkerSpec> local_workers(
    int n, const std::string& name, const std::map<std::string, std::string>& env,
    const std::string& log_prefix) {
  const int port = mixtrain::pick_free_port();
  std::vector<mixtrain::WorkerSpec> specs(n);
  for (int rank = 0; rank < n; ++rank) {
    mixtrain::WorkerSpec& spec = specs[rank];
    spec.argv = {name};
    spec.env = env;
    spec.env["RANK"] = std::to_string(rank);
    spec.env["WORLD_SIZE"] = std::to_string(n);
    spec.env["LOCAL_RANK"] = std::to_string(rank);
    spec.env["MASTER_ADDR"] = "127.0.0.1";
    spec.env["MASTER_PORT"] = std::to_string(port);
    spec.env["MIXTRAIN_LAUNCHED"] = "1";
    spec.env["OMP_NUM_THREADS"] = "1";
    spec.output_path = log_prefix + std::to_string(rank) + ".log";
  }
  return specs;
}

}  // namespace mixtrain::bench
