// Checkpoints through the command line, one process (two ranks saving, one resuming:
// checkpoint_resume_distributed_test.cpp):
// - `train.steps=4` in one run equals `train.steps=2` (saving at the end, asynchronously) and
//   then a second run with checkpoint.restore_from and `train.steps=4`: metrics.jsonl lines of
//   steps 3 and 4 are identical except the timing fields (tokens_per_s, elapsed_s);
// - kill -9 at random moments of a run that saves every step never leaves an unloadable
//   checkpoint: after each kill `latest` names a step that `ckpt verify` passes, and a run
//   restores from it.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "support/checkpoint_surgery.h"
#include "support/child_process.h"
#include "support/train_then_resume.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

// The fp32-main-params §1 configuration (bfloat16, fp32 main params, Muon + AdamW) with a constant
// LR, so that steps 1-2 do not depend on train.steps.
std::string base_command(const std::string& run_dir) {
  return "train --config " + source_path("configs/qwen2_moe_tiny.yaml") +
         " --set train.lr_scheduler.warmup_steps=0 --set train.lr_scheduler.decay=constant" +
         " --set data.seq_len=32 --run-dir " + run_dir;
}

TEST(CheckpointResume, SecondRunContinuesLikeOneRun) {
  TrainThenResume runs;
  ASSERT_NO_FATAL_FAILURE(train_then_resume(
      base_command, " --set checkpoint.interval=2 --set checkpoint.async=true", runs));
  EXPECT_NE(runs.first.output.find("checkpoint: saved step 2"), std::string::npos)
      << runs.first.output;
}

// The two examples at the command line: data.position set to a string and rng_cpu cut
// short (the metadata's checksum rewritten to match, as a tool that edits it would) are one
// error naming the file and the field, exit 1, no "internal error", nothing trained.
TEST(CheckpointResume, MalformedStateIsOneCleanError) {
  TempDir run;
  const CommandResult saved = run_mixtrain(base_command(run.file("a")) +
                                           " --set train.steps=1 --set checkpoint.interval=1");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const std::string step_dir = run.file("a/checkpoints/step-00000001");
  nlohmann::json good;
  {
    std::ifstream in(step_dir + "/.metadata.json");
    good = nlohmann::json::parse(in);
  }
  const std::string rng = good["state"]["ranks"][0]["rng_cpu"];
  const std::vector<std::pair<std::string, std::string>> edits = {
      {"/state/data/position", "\"12\""},
      {"/state/ranks/0/rng_cpu", "\"" + rng.substr(0, 64) + "\""}};
  const std::vector<std::string> expected = {
      "state.data.position: must be an integer, got \"12\"",
      "state.ranks[0].rng_cpu: must be " + std::to_string(rng.size()) + " hex digits"};
  for (size_t i = 0; i < edits.size(); ++i) {
    nlohmann::json edited = good;
    edited[nlohmann::json::json_pointer(edits[i].first)] = nlohmann::json::parse(edits[i].second);
    test_support::rewrite_metadata(step_dir, edited);
    const CommandResult r = run_mixtrain(
        base_command(run.file("b")) +
        " --set train.steps=2 --set checkpoint.restore_from=" + run.file("a/checkpoints"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("mixtrain: error: checkpoint " + step_dir +
                            " cannot be restored (nothing was changed):\n  - " + step_dir +
                            "/.metadata.json: " + expected[i]),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(run.file("b/metrics.jsonl"))) << r.output;
  }
}

TEST(CheckpointResume, KillNineDuringSavesLeavesLoadableCheckpoint) {
  TempDir run;
  const std::string checkpoints = run.file("checkpoints");
  std::mt19937 random(20261130);
  std::uniform_int_distribution<int> delay_ms(0, 400);
  for (int attempt = 0; attempt < 6; ++attempt) {
    // Every step saves (keep_last 2: saving, publishing and pruning all happen constantly).
    std::vector<std::string> args = {MIXTRAIN_BINARY, "train",
                                     "--config",      source_path("configs/qwen2_moe_tiny.yaml"),
                                     "--set",         "train.steps=100000",
                                     "--set",         "checkpoint.interval=1",
                                     "--set",         "checkpoint.keep_last=2",
                                     "--run-dir",     run.path()};
    if (attempt > 0) {
      args.push_back("--set");
      args.push_back("checkpoint.restore_from=" + checkpoints);
    }
    ChildOptions quiet;
    quiet.stdout_path = quiet.stderr_path = "/dev/null";
    ChildProcess train(args, quiet);  // 100000 steps: killed below, or by ~ChildProcess
    // Wait for a first save of this run, then kill at a random moment.
    const std::string latest = checkpoints + "/latest";
    std::string before;
    if (std::ifstream in(latest); in) std::getline(in, before);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    std::string now = before;
    while (now == before && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (std::ifstream in(latest); in) std::getline(in, now);
    }
    ASSERT_NE(now, before) << "no checkpoint was saved in time";
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(random)));
    train.signal(SIGKILL);
    train.wait();

    const CommandResult verify = run_mixtrain("ckpt verify " + checkpoints);
    EXPECT_EQ(verify.exit_code, 0) << "attempt " << attempt << ": " << verify.output;
  }
  // And training restores from what the last kill left.
  std::string latest;
  std::getline(std::ifstream(checkpoints + "/latest"), latest);
  const int64_t step = std::stoll(latest.substr(latest.find('-') + 1));
  const CommandResult resumed =
      run_mixtrain("train --config " + source_path("configs/qwen2_moe_tiny.yaml") +
                   " --set checkpoint.restore_from=" + checkpoints + " --set train.steps=" +
                   std::to_string(step + 1) + " --run-dir " + run.file("resumed"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("restored step " + std::to_string(step)), std::string::npos)
      << resumed.output;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
