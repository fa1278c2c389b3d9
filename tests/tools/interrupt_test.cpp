// Ctrl-C during `mixtrain train`: the run stops between steps with exit code 130, every
// completed step is in metrics.jsonl as whole JSON lines, and the loss picture is written.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tools/cli_test_util.h"

extern char** environ;

namespace mixtrain::testing {
namespace {

size_t count_lines(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

TEST(Interrupt, CtrlCFlushesMetricsAndExits130) {
  TempDir run;
  std::vector<std::string> args = {
      MIXTRAIN_BINARY, "train",
      "--config",      source_path("configs/qwen2_moe_tiny_adamw.yaml"),
      "--set",         "train.steps=100000",
      "--run-dir",     run.path()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, MIXTRAIN_BINARY, &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);

  const std::string metrics = run.file("metrics.jsonl");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (count_lines(metrics) < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(count_lines(metrics), 3u) << "training produced no metrics in time";
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
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

}  // namespace
}  // namespace mixtrain::testing
