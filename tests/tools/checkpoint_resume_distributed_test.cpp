// Checkpoints of two ranks through the command line: saved asynchronously with keep_last 1,
// inspected and verified by `mixtrain ckpt`, and resumed on one rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

TEST(CheckpointResume, TwoRanksSaveAsynchronouslyAndOneRankResumes) {
  TempDir run;
  const CommandResult saved = run_mixtrain(
      "train --config " + source_path("configs/qwen2_moe_tiny.yaml") + " --run-dir " + run.path() +
      " --nproc 2 --set train.steps=4 --set checkpoint.interval=2"
      " --set checkpoint.async=true --set checkpoint.keep_last=1");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const std::string checkpoints = run.file("checkpoints");
  // keep_last 1: only step 4 is left, written by both ranks.
  EXPECT_FALSE(std::filesystem::exists(checkpoints + "/step-00000002"));
  const CommandResult inspect = run_mixtrain("ckpt inspect " + checkpoints);
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("step: 4"), std::string::npos) << inspect.output;
  EXPECT_NE(inspect.output.find("world size: 2"), std::string::npos) << inspect.output;
  const CommandResult verify = run_mixtrain("ckpt verify " + checkpoints);
  EXPECT_EQ(verify.exit_code, 0) << verify.output;

  const CommandResult resumed = run_mixtrain(
      "train --config " + source_path("configs/qwen2_moe_tiny.yaml") + " --run-dir " +
      run.file("one") + " --set train.steps=5" + " --set checkpoint.restore_from=" + checkpoints);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("restored step 4"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("saved by 2 rank(s), restored on 1"), std::string::npos)
      << resumed.output;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
