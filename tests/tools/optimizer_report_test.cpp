// The live optimizer report of `mixtrain train` (trainer/optimizer_report.h): after a restore
// whose checkpoint was written with other learning rates than the resuming config sets, the
// report printed after the restore shows the checkpoint's values, and the one printed after
// construction the config's; with two ranks only rank 0 prints it.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

// The fp32-main-params §1 configuration (bfloat16, fp32 main params, Muon + AdamW), one short step.
std::string base_command(const std::string& run_dir) {
  return "train --config " + source_path("configs/qwen2_moe_tiny.yaml") +
         " --set data.seq_len=32 --set train.steps=1 --run-dir " + run_dir;
}

// The text of the report that starts with "Optimizer <when> (", up to the line after its
// main-params line; empty when there is none.
std::string report_block(const std::string& output, const std::string& when) {
  const size_t start = output.find("Optimizer " + when + " (");
  if (start == std::string::npos) return "";
  const size_t main = output.find("fp32 main params:", start);
  if (main == std::string::npos) return "";
  return output.substr(start, output.find('\n', main) - start);
}

// The whitespace-separated cells of the first line of `table` (the rows after the header line
// that starts with "  <optimizer> ") whose first cell is `row`.
std::vector<std::string> table_row(const std::string& block, const std::string& optimizer,
                                   const std::string& row) {
  std::istringstream in(block);
  bool in_table = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("  " + optimizer + " ", 0) == 0) {
      in_table = true;
      continue;
    }
    std::istringstream words(line);
    std::vector<std::string> cells;
    for (std::string cell; words >> cell;) cells.push_back(cell);
    if (in_table && !cells.empty() && cells[0] == row) return cells;
  }
  return {};
}

TEST(OptimizerReport, RestoreShowsTheCheckpointsLearningRates) {
  TempDir run;
  const CommandResult first =
      run_mixtrain(base_command(run.path()) +
                   " --set checkpoint.interval=1 --set optimizer.adamw_config.adamw_lr=0.004"
                   " --set optimizer.muon_config.muon_lr=0.03");
  ASSERT_EQ(first.exit_code, 0) << first.output;

  const CommandResult second = run_mixtrain(
      base_command(run.path()) + " --set checkpoint.restore_from=" + run.file("checkpoints") +
      " --set optimizer.adamw_config.adamw_lr=0.002 --set optimizer.muon_config.muon_lr=0.01");
  ASSERT_EQ(second.exit_code, 0) << second.output;

  const std::string built = report_block(second.output, "after construction");
  const std::string restored = report_block(second.output, "after the restore");
  ASSERT_FALSE(built.empty()) << second.output;
  ASSERT_FALSE(restored.empty()) << second.output;
  EXPECT_LT(second.output.find(built), second.output.find(restored));

  // Cells: lr, key, constructor default, then one value per group (adamw: decay and no-decay
  // groups; muon: one group). YAML defaults: torch.optim.AdamW's 0.001, Muon's 0.02.
  EXPECT_EQ(table_row(built, "adamw", "lr"),
            (std::vector<std::string>{"lr", "optimizer.adamw_config.adamw_lr", "0.001", "0.002",
                                      "0.002"}))
      << built;
  EXPECT_EQ(table_row(built, "muon", "lr"),
            (std::vector<std::string>{"lr", "optimizer.muon_config.muon_lr", "0.02", "0.01"}))
      << built;
  EXPECT_EQ(table_row(restored, "adamw", "lr"),
            (std::vector<std::string>{"lr", "optimizer.adamw_config.adamw_lr", "0.001", "0.004",
                                      "0.004"}))
      << restored;
  EXPECT_EQ(table_row(restored, "muon", "lr"),
            (std::vector<std::string>{"lr", "optimizer.muon_config.muon_lr", "0.02", "0.03"}))
      << restored;
  // The no-decay group is there, and the bfloat16 model has fp32 main params.
  EXPECT_NE(restored.find("group 1 (no decay)"), std::string::npos) << restored;
  EXPECT_NE(restored.find("fp32 main params: "), std::string::npos) << restored;
  EXPECT_EQ(restored.find("fp32 main params: none"), std::string::npos) << restored;

  // A run without a restore prints only the construction report.
  EXPECT_EQ(first.output.find("Optimizer after the restore"), std::string::npos) << first.output;
  EXPECT_FALSE(report_block(first.output, "after construction").empty()) << first.output;
}

// Two ranks: only rank 0 logs the report (other ranks would tag their lines "[rank 1]").
TEST(OptimizerReport, OnlyRankZeroLogsIt) {
  TempDir run;
  const CommandResult result = run_mixtrain(
      "train --config " + source_path("configs/qwen2_moe_tiny.toml") +
      " --set training.steps=1 --set training.seq_len=32 --nproc 2 --run-dir " + run.path());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::string header = "Optimizer after construction (";
  const size_t first = result.output.find(header);
  ASSERT_NE(first, std::string::npos) << result.output;
  EXPECT_EQ(result.output.find(header, first + 1), std::string::npos) << result.output;
  // The TOML dialect's keys and defaults: torchtitan's lr default 8e-4.
  EXPECT_EQ(table_row(report_block(result.output, "after construction"), "adamw", "lr"),
            (std::vector<std::string>{"lr", "optimizer.lr", "0.0008", "0.00022"}))
      << result.output;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
