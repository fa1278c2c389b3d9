// The benchmarks' local multi-process runs: N worker processes of this binary on loopback Gloo,
// each writing its figures to <out>/rank<r>.json, and the worker side's exit code.
#pragma once

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_support.h"
#include "mixtrain/core/posix_file.h"
#include "mixtrain/distributed/launcher.h"

namespace mixtrain::bench {

// One spec per rank for n local workers (argv[0] = `name`): the torchrun variables (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR 127.0.0.1, MASTER_PORT a port the specs keep reserved
// while they live: mixtrain::ReservedPort), MIXTRAIN_LAUNCHED, one intra-op thread, plus `env`;
// rank r's output goes to log_prefix + r + ".log".
inline std::vector<mixtrain::WorkerSpec> local_workers(
    int n, const std::string& name, const std::map<std::string, std::string>& env,
    const std::string& log_prefix) {
  const auto reserved = std::make_shared<const mixtrain::ReservedPort>();
  const int port = reserved->port();
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
    spec.reserved_port = reserved;
  }
  return specs;
}

// Runs n local workers (local_workers(n, name, env, out + "/rank"), `out` created first) with a
// 30-minute deadline and returns each rank's <out>/rank<r>.json. When a rank failed or wrote no
// file, prints "<program_name()>: <n> ranks: rank <r> <how it ended>; end of its log:" and the
// log's last 8 lines to stderr, and returns no rows.
inline std::vector<nlohmann::json> run_local_workers(int n, const std::string& name,
                                                     const std::map<std::string, std::string>& env,
                                                     const std::string& out) {
  std::filesystem::create_directories(out);
  const std::vector<mixtrain::WorkerSpec> specs = local_workers(n, name, env, out + "/rank");
  mixtrain::LaunchOptions launch;
  launch.deadline_s = 1800;
  const auto outcomes = mixtrain::run_worker_processes(specs, launch);
  std::vector<nlohmann::json> ranks;
  for (int rank = 0; rank < n; ++rank) {
    std::ifstream in(out + "/rank" + std::to_string(rank) + ".json");
    if (!outcomes[rank].ok() || !in) {
      std::fprintf(stderr, "%s: %d ranks: rank %d %s; end of its log:\n%s", program_name().c_str(),
                   n, rank, outcomes[rank].describe().c_str(),
                   tail_of_file(specs[rank].output_path, 8).c_str());
      return {};
    }
    ranks.push_back(nlohmann::json::parse(in));
  }
  return ranks;
}

// A worker's figures: <out>/rank<rank>.json, published whole (the launcher never reads half a
// file).
inline void write_rank_result(const std::string& out, int rank, const nlohmann::json& result) {
  const std::string path = out + "/rank" + std::to_string(rank) + ".json";
  mixtrain::AtomicFile file(path, path + ".tmp");
  file.write(result.dump() + "\n");
  file.publish(/*sync_directory=*/false);
}

// The command line of a program that runs its workers at several rank counts: --nproc N
// (repeatable, each >= 2; `default_nprocs` when none), --steps S (>= min_steps; `why_min` says
// why, as int_at_least prints it), --work-dir, --keep, --help with `usage` (parse_arguments).
struct RankSweepOptions {
  std::vector<int> nprocs;
  int steps = 0;
  std::string work_dir;
  bool keep = false;
};
inline RankSweepOptions parse_rank_sweep_options(int argc, char** argv, const char* usage,
                                                 int default_steps, int min_steps,
                                                 const char* why_min,
                                                 std::vector<int> default_nprocs) {
  RankSweepOptions options;
  options.steps = default_steps;
  parse_arguments(argc, argv, usage, nullptr, options.work_dir, options.keep,
                  [&](const std::string& arg, const auto& value) {
                    if (arg == "--nproc") {
                      options.nprocs.push_back(int_at_least(value(), "--nproc", 2));
                    } else if (arg == "--steps") {
                      options.steps = int_at_least(value(), "--steps", min_steps, why_min);
                    } else {
                      return false;
                    }
                    return true;
                  });
  if (options.nprocs.empty()) options.nprocs = std::move(default_nprocs);
  return options;
}

// A worker process's exit code: work()'s, or 1 with "ERROR: <what>" on stderr when it throws.
template <class Work>
int worker_exit_code(Work&& work) {
  try {
    return work();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ERROR: %s\n", error.what());
    return 1;
  }
}

}  // namespace mixtrain::bench
