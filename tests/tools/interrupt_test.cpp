// Ctrl-C during `mixtrain train`: the run stops between steps with exit code 130, every
// completed step is in metrics.jsonl as whole JSON lines, and the loss picture is written.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "support/child_process.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

size_t count_lines(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

TEST(Interrupt, CtrlCFlushesMetricsAndExits130) {
  TempDir run;
  ChildOptions quiet;
  quiet.stderr_path = "/dev/null";
  // 100000 steps: only the SIGINT below ends it (or ~ChildProcess, if an assertion fails).
  ChildProcess train(
      {MIXTRAIN_BINARY, "train", "--config", source_path("configs/qwen2_moe_tiny_adamw.yaml"),
       "--set", "train.steps=100000", "--run-dir", run.path()},
      quiet);

  const std::string metrics = run.file("metrics.jsonl");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (count_lines(metrics) < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(count_lines(metrics), 3u) << "training produced no metrics in time";
  train.signal(SIGINT);
  const int status = train.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);

  std::ifstream in(metrics);
  std::string line;
  int64_t expected_step = 1;
  while (std::getline(in, line)) {
    nlohmann::json row = nlohmann::json::parse(line);  // throws on a torn line
    EXPECT_EQ(row["step"].get<int64_t>(), expected_step++);
  }
  EXPECT_LT(expected_step, 100000);
  EXPECT_TRUE(std::filesystem::exists(run.file("loss.svg")));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
