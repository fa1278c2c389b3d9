// The swap optimizer through the command line: with optimizer.swap_optimizer on and off, 20
// steps of the RFC's configuration (bfloat16, fp32 main params, Muon + AdamW) give identical
// metrics (every field but the timings) on 1 rank and on 2 ranks (FSDP: distributed Muon),
// and identical checkpoints (`ckpt diff --atol 0`: every tensor equal; the state differs only
// in the config leaf that switched swapping on). Small buckets make every step stream the
// state through many groups.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace {

nlohmann::json without_timing(nlohmann::json row) {
  row.erase("tokens_per_s");
  row.erase("elapsed_s");
  return row;
}

void expect_swap_changes_nothing(const std::string& nproc) {
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
}

TEST(SwapOptimizer, OneRankTrainsIdentically) {
  expect_swap_changes_nothing("1");
}
TEST(SwapOptimizer, TwoRanksTrainIdentically) {
  expect_swap_changes_nothing("2");
}

}  // namespace
}  // namespace mixtrain::testing
