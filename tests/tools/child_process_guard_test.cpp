// support/child_process.h: a test whose assertion fails while `mixtrain train --nproc 2` runs
// 100000 steps leaves nothing behind; the guard kills the launcher and both ranks, and reaps
// the launcher, before the failure reaches gtest.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/child_process.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

// What the failing body saw (EXPECT_FATAL_FAILURE's statement cannot use locals).
pid_t g_launcher = -1;
std::vector<pid_t> g_ranks;
std::string g_run_dir;

void start_a_long_run_then_fail_an_assertion() {
  ChildOptions quiet;
  quiet.stdout_path = quiet.stderr_path = "/dev/null";
  ChildProcess launcher(
      {MIXTRAIN_BINARY, "train", "--config", source_path("configs/qwen2_moe_tiny.yaml"), "--nproc",
       "2", "--set", "train.steps=100000", "--run-dir", g_run_dir},
      quiet);
  g_launcher = launcher.pid();
  // Until the ranks train (a first metrics line), so both exist.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (read_metrics(g_run_dir + "/metrics.jsonl").empty() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  g_ranks = children_of(launcher.pid());
  ASSERT_TRUE(false) << "an assertion fails while the run goes on";
}

TEST(ChildProcessGuard, FailedAssertionKillsTheRunAndItsRanks) {
  TempDir run;
  g_run_dir = run.path();
  EXPECT_FATAL_FAILURE(start_a_long_run_then_fail_an_assertion(),
                       "an assertion fails while the run goes on");
  ASSERT_GT(g_launcher, 0);
  ASSERT_EQ(g_ranks.size(), 2u) << "the ranks never started";
  // The launcher is reaped: not even a zombie is left.
  EXPECT_NE(kill(g_launcher, 0), 0) << "launcher " << g_launcher << " still exists";
  // The ranks got the group's SIGKILL; their new parent reaps them, so allow a moment.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (pid_t rank : g_ranks) {
    while (!process_ended(rank) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(process_ended(rank)) << "rank process " << rank << " survived";
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
