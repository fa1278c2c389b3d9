// Multi-process tests: run a named worker body in N real processes of the current gtest binary.
//
//   #include "support/multiprocess.h"
//
//   MIXTRAIN_WORKER(sum_ranks) {            // body: void(const WorkerEnv& worker)
//     mixtrain::DeviceMesh mesh = worker.make_mesh();   // Gloo groups from the env below
//     at::Tensor t = at::full({1}, double(worker.rank.rank));
//     mesh.world->all_reduce_sum(t);
//     EXPECT_EQ(t.item<double>(), 1.0);                 // gtest assertions work in workers
//     worker.write_text("sum_" + std::to_string(worker.rank.rank), "...");  // -> the test
//   }
//   TEST(X, Y) {
//     mixtrain::ParallelConfig parallel;  parallel.dp_shard = 2;
//     WorkerResult result = run_workers("sum_ranks", 2, parallel);
//     ASSERT_TRUE(result.all_ok()) << result.summary();   // summary: exits + captured output
//     EXPECT_EQ(result.read_text("sum_1"), "...");
//   }
//
// How: run_workers starts nproc copies of /proc/self/exe (the launcher's run_worker_processes:
// reaped, no orphans) with MIXTRAIN_TEST_WORKER=<name>, the torchrun variables (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT=<a ReservedPort, held until the
// ranks are reaped: no parallel test can take it first>), the parallel degrees,
// the timeout, MIXTRAIN_TEST_DIR (a fresh temp dir, removed with the WorkerResult) and
// `extra_env`. In such a process a gtest global environment, set up before any test runs,
// finds the body, runs it and exits: 0 if it returned with no gtest failure, 1 on a failure
// or an exception (what() printed), a UserError's exit_code(). stdout+stderr of each rank are
// captured to files. timeout_s is the workers' distributed.timeout_s; ranks still running after
// 2 * timeout_s + 60 s are killed (a broken test never hangs ctest).
// Worker bodies must not depend on gtest flags: they run before any TEST and without argv.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/launcher.h"
#include "mixtrain/distributed/rendezvous.h"

namespace mixtrain::testing {

// What a worker body sees.
struct WorkerEnv {
  RankInfo rank;              // from detect_rank_info()
  ParallelConfig parallel;    // the degrees passed to run_workers
  double timeout_s = 60;      // distributed.timeout_s for make_mesh()
  std::filesystem::path dir;  // shared with the test (MIXTRAIN_TEST_DIR)

  DeviceMesh make_mesh() const { return make_device_mesh(rank, parallel, timeout_s); }
  // An env variable (extra_env of run_workers), or `fallback`.
  std::string get(const std::string& key, const std::string& fallback = "") const {
    const char* value = std::getenv(key.c_str());
    return value != nullptr ? value : fallback;
  }
  void write_text(const std::string& name, const std::string& text) const {
    const std::filesystem::path tmp = dir / (name + ".tmp");
    { std::ofstream(tmp) << text; }
    std::filesystem::rename(tmp, dir / name);  // readers never see half a file
  }
};

using WorkerBody = void (*)(const WorkerEnv&);

struct WorkerResult {
  std::vector<WorkerOutcome> ranks;  // exit status and pid per rank
  std::vector<std::string> outputs;  // captured stdout+stderr per rank
  double seconds = 0;                // wall time of the whole run
  std::shared_ptr<const std::filesystem::path> dir_owner;

  const std::filesystem::path& dir() const { return *dir_owner; }
  bool all_ok() const {
    for (const WorkerOutcome& outcome : ranks) {
      if (!outcome.ok()) return false;
    }
    return !ranks.empty();
  }
  // A file a worker wrote with write_text ("" if absent).
  std::string read_text(const std::string& name) const {
    std::ifstream in(dir() / name);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  std::string summary() const {
    std::string text;
    for (size_t r = 0; r < ranks.size(); ++r) {
      text += "--- rank " + std::to_string(r) + " (pid " + std::to_string(ranks[r].pid) + ") " +
              ranks[r].describe() + ":\n" + outputs[r] + "\n";
    }
    return text;
  }
};

namespace detail {

inline std::map<std::string, WorkerBody>& worker_registry() {
  static std::map<std::string, WorkerBody> registry;
  return registry;
}

// Names are unique per executable (one holds a whole test folder): a second body under one name
// would silently replace the first, so it stops the executable before any test runs.
struct WorkerRegistrar {
  WorkerRegistrar(const char* name, WorkerBody body) {
    if (!worker_registry().emplace(name, body).second) {
      std::fprintf(stderr, "MIXTRAIN_WORKER(%s) is defined twice in this test executable\n", name);
      std::abort();
    }
  }
};

inline double env_double(const char* key, double fallback) {
  const char* value = std::getenv(key);
  return value != nullptr ? std::strtod(value, nullptr) : fallback;
}
inline int64_t env_int(const char* key, int64_t fallback) {
  const char* value = std::getenv(key);
  return value != nullptr ? std::strtoll(value, nullptr, 10) : fallback;
}

// Runs in a worker process when gtest sets up its environments, i.e. after every static
// initializer (so every MIXTRAIN_WORKER is registered) and before any TEST.
class WorkerEnvironment : public ::testing::Environment {
 public:
  explicit WorkerEnvironment(std::string name) : name_(std::move(name)) {}
  void SetUp() override {
    int status = 0;
    try {
      const auto it = worker_registry().find(name_);
      if (it == worker_registry().end()) {
        throw std::runtime_error("no MIXTRAIN_WORKER named '" + name_ + "' in this binary");
      }
      WorkerEnv worker;
      worker.rank = detect_rank_info();
      set_log_rank(worker.rank.rank);
      worker.parallel.dp_replicate = env_int("MIXTRAIN_TEST_DP_REPLICATE", 1);
      worker.parallel.dp_shard = env_int("MIXTRAIN_TEST_DP_SHARD", worker.rank.world_size);
      worker.parallel.ep = env_int("MIXTRAIN_TEST_EP", 1);
      worker.parallel.cp = env_int("MIXTRAIN_TEST_CP", 1);
      worker.parallel.tp = env_int("MIXTRAIN_TEST_TP", 1);
      worker.timeout_s = env_double("MIXTRAIN_TEST_TIMEOUT_S", 60);
      const char* dir = std::getenv("MIXTRAIN_TEST_DIR");
      worker.dir = dir != nullptr ? dir : ".";
      it->second(worker);
      if (::testing::Test::HasFailure()) status = 1;
    } catch (const UserError& error) {
      std::cerr << "ERROR: " << error.what() << std::endl;
      status = error.exit_code();
    } catch (const std::exception& error) {
      std::cerr << "ERROR: " << error.what() << std::endl;
      status = 1;
    }
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    // _exit: skip static destructors and gtest's own run; the body has released its groups.
    _exit(status);
  }

 private:
  std::string name_;
};

inline bool install_worker_hook() {
  const char* name = std::getenv("MIXTRAIN_TEST_WORKER");
  if (name != nullptr && *name != '\0') {
    ::testing::AddGlobalTestEnvironment(new WorkerEnvironment(name));
  }
  return true;
}

inline const bool worker_hook_installed = install_worker_hook();

}  // namespace detail

// Starts `nproc` ranks running the worker `name`; see the header comment.
inline WorkerResult run_workers(const std::string& name, int nproc, const ParallelConfig& parallel,
                                std::map<std::string, std::string> extra_env = {},
                                double timeout_s = 60) {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "mixtrain_workers_XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  WorkerResult result;
  result.dir_owner = std::shared_ptr<const std::filesystem::path>(
      new std::filesystem::path(pattern), [](const std::filesystem::path* path) {
        std::error_code ignored;
        std::filesystem::remove_all(*path, ignored);
        delete path;
      });
  const auto reserved = std::make_shared<const ReservedPort>();
  const int port = reserved->port();
  std::vector<WorkerSpec> specs(nproc);
  for (int rank = 0; rank < nproc; ++rank) {
    WorkerSpec& spec = specs[rank];
    spec.argv = {"mixtrain_test_worker_" + name};
    spec.env = extra_env;
    spec.env["MIXTRAIN_TEST_WORKER"] = name;
    spec.env["MIXTRAIN_TEST_DIR"] = pattern;
    spec.env["MIXTRAIN_TEST_DP_REPLICATE"] = std::to_string(parallel.dp_replicate);
    spec.env["MIXTRAIN_TEST_DP_SHARD"] = std::to_string(parallel.dp_shard);
    spec.env["MIXTRAIN_TEST_EP"] = std::to_string(parallel.ep);
    spec.env["MIXTRAIN_TEST_CP"] = std::to_string(parallel.cp);
    spec.env["MIXTRAIN_TEST_TP"] = std::to_string(parallel.tp);
    spec.env["MIXTRAIN_TEST_TIMEOUT_S"] = std::to_string(timeout_s);
    spec.env["RANK"] = std::to_string(rank);
    spec.env["WORLD_SIZE"] = std::to_string(nproc);
    spec.env["LOCAL_RANK"] = std::to_string(rank);
    spec.env["MASTER_ADDR"] = "127.0.0.1";
    spec.env["MASTER_PORT"] = std::to_string(port);
    spec.env["MIXTRAIN_LAUNCHED"] = "1";
    if (spec.env.count("OMP_NUM_THREADS") == 0) spec.env["OMP_NUM_THREADS"] = "1";
    spec.output_path = pattern + "/rank" + std::to_string(rank) + ".log";
    spec.reserved_port = reserved;
  }
  LaunchOptions options;
  options.drain_s = std::min(timeout_s, 1.0);  // survivors print their error, then SIGTERM
  options.deadline_s = 2 * timeout_s + 60;
  const auto start = std::chrono::steady_clock::now();
  result.ranks = run_worker_processes(specs, options);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int rank = 0; rank < nproc; ++rank) {
    std::ifstream in(specs[rank].output_path);
    std::stringstream text;
    text << in.rdbuf();
    result.outputs.push_back(text.str());
  }
  return result;
}

}  // namespace mixtrain::testing

// Defines and registers a worker body: MIXTRAIN_WORKER(name) { ... uses `worker` ... }
#define MIXTRAIN_WORKER(name)                                                                 \
  static void mixtrain_worker_##name(                                                         \
      [[maybe_unused]] const ::mixtrain::testing::WorkerEnv& worker);                         \
  static const ::mixtrain::testing::detail::WorkerRegistrar mixtrain_worker_registrar_##name( \
      #name, &mixtrain_worker_##name);                                                        \
  static void mixtrain_worker_##name([[maybe_unused]] const ::mixtrain::testing::WorkerEnv& worker)
