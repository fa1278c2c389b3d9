// The swap optimizer's check through the command line (swap_optimizer_test.cpp: 1 rank,
// swap_optimizer_distributed_test.cpp: 2 ranks): with optimizer.swap_optimizer on and off, 20
// steps of the fp32-main-params §1 configuration (bfloat16, fp32 main params, Muon + AdamW) give
// identical metrics (every field but the timings) and identical checkpoints (`ckpt diff --atol
// 0`: every tensor equal; the state differs only in the config leaf that switched swapping on).
// Small buckets make every step stream the state through many groups. With `resume`, resuming
// with swap on from a checkpoint saved without it continues like resuming without.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tools/cli_test_util.h"

namespace mixtrain::testing {

inline void expect_swap_changes_nothing(const std::string& nproc, bool resume = false) {
  TempDir off, on;
  const std::string common =
      "train --config " + source_path("configs/qwen2_moe_tiny.yaml") + " --nproc " + nproc +
      " --set train.steps=20 --set checkpoint.interval=20" +
      " --set optimizer.swap_bucket_mb=1 --set optimizer.swap_merge_buckets=2";
  const CommandResult a = run_mixtrain(common + " --run-dir " + off.path());
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const CommandResult b =
      run_mixtrain(common + " --set optimizer.swap_optimizer=true --run-dir " + on.path());
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("swap optimizer: optimizer state lives in"), std::string::npos)
      << b.output;

  const auto rows_off = read_metrics(off.file("metrics.jsonl"));
  const auto rows_on = read_metrics(on.file("metrics.jsonl"));
  ASSERT_EQ(rows_off.size(), 20u);
  ASSERT_EQ(rows_on.size(), 20u);
  for (size_t i = 0; i < rows_off.size(); ++i) {
    EXPECT_EQ(without_timing(rows_on[i]), without_timing(rows_off[i])) << "step " << i + 1;
  }
  const CommandResult diff = run_mixtrain("ckpt diff " + off.file("checkpoints") + " " +
                                          on.file("checkpoints") + " --atol 0");
  EXPECT_EQ(diff.exit_code, 0) << diff.output;
  // The swap files are removed at exit.
  EXPECT_TRUE(std::filesystem::is_empty(on.file("swap"))) << on.file("swap");
  if (!resume) return;

  // A restore writes the loaded state into the file: resuming the unswapped run's checkpoint
  // with swap on continues exactly like resuming it without.
  TempDir resumed_off, resumed_on;
  const std::string resume_common =
      common + " --set train.steps=22 --set checkpoint.restore_from=" + off.file("checkpoints");
  const CommandResult c = run_mixtrain(resume_common + " --run-dir " + resumed_off.path());
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const CommandResult d = run_mixtrain(
      resume_common + " --set optimizer.swap_optimizer=true --run-dir " + resumed_on.path());
  ASSERT_EQ(d.exit_code, 0) << d.output;
  const auto after_off = read_metrics(resumed_off.file("metrics.jsonl"));
  const auto after_on = read_metrics(resumed_on.file("metrics.jsonl"));
  ASSERT_EQ(after_off.size(), 2u);  // steps 21 and 22
  ASSERT_EQ(after_on.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(without_timing(after_on[i]), without_timing(after_off[i])) << "step " << 21 + i;
  }
}

}  // namespace mixtrain::testing
