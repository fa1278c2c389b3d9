// The train-then-resume comparison the command-line tests share: one run of 4 steps against a
// run of 2 steps that saves a checkpoint and a second run restored from it to step 4.
//   continuous: command(continuous) + " --set train.steps=4"
//   split:      command(split) + " --set train.steps=2" + first_options, then
//               command(split) + " --set train.steps=4 --set
//               checkpoint.restore_from=<split>/checkpoints"
// Asserts that every run exits 0, that the second logs "restored step 2", and that both
// metrics.jsonl files hold 4 rows equal except their timing fields. Call it inside
// ASSERT_NO_FATAL_FAILURE; the runs and their directories stay in `runs` for further checks.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "tools/cli_test_util.h"

namespace mixtrain::testing {

struct TrainThenResume {
  TempDir continuous, split;         // the two run directories
  CommandResult one, first, second;  // the 4-step run; the 2-step run; the restored run
};

inline void train_then_resume(const std::function<std::string(const std::string&)>& command,
                              const std::string& first_options, TrainThenResume& runs) {
  runs.one = run_mixtrain(command(runs.continuous.path()) + " --set train.steps=4");
  ASSERT_EQ(runs.one.exit_code, 0) << runs.one.output;
  runs.first = run_mixtrain(command(runs.split.path()) + " --set train.steps=2" + first_options);
  ASSERT_EQ(runs.first.exit_code, 0) << runs.first.output;
  runs.second = run_mixtrain(
      command(runs.split.path()) +
      " --set train.steps=4 --set checkpoint.restore_from=" + runs.split.file("checkpoints"));
  ASSERT_EQ(runs.second.exit_code, 0) << runs.second.output;
  EXPECT_NE(runs.second.output.find("restored step 2"), std::string::npos) << runs.second.output;

  const auto expected = read_metrics(runs.continuous.file("metrics.jsonl"));
  const auto resumed = read_metrics(runs.split.file("metrics.jsonl"));
  ASSERT_EQ(expected.size(), 4u);
  // The resumed run keeps the first run's lines of steps 1-2 and appends 3-4.
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(without_timing(resumed[i]), without_timing(expected[i])) << "step " << i + 1;
  }
}

}  // namespace mixtrain::testing
