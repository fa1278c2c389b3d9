// The per-step op budget (issue 35): `mixtrain train --set train.count_ops=true` on
// configs/qwen2_moe_tiny.yaml must not dispatch more ATen ops or allocate more buffers per step,
// in any phase, than tests/tools/op_budget.json records. A change that needs more updates the
// file in the same commit, deliberately; one that needs fewer should lower it (the test prints
// the counts). Counting must not change what is computed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

std::string tiny_command(const std::string& run_dir, int steps) {
  return "train --config " + source_path("configs/qwen2_moe_tiny.yaml") + " --run-dir " + run_dir +
         " --set train.steps=" + std::to_string(steps) + " --set train.log_every=1";
}

TEST(OpBudget, TinyStepStaysWithinTheRecordedBudget) {
  std::ifstream file(source_path("tests/tools/op_budget.json"));
  ASSERT_TRUE(file) << "tests/tools/op_budget.json";
  const nlohmann::json budget = nlohmann::json::parse(file);
  const int steps = budget.at("steps").get<int>();
  TempDir run;
  const CommandResult r =
      run_mixtrain(tiny_command(run.path(), steps) + " --set train.count_ops=true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metrics(run.file("metrics.jsonl"));
  ASSERT_EQ(rows.size(), static_cast<size_t>(steps));
  // Step 1 creates the optimizer state (its own, larger count); the budget is for the steps
  // after it, each of which must fit (routing makes them differ).
  for (const auto& [key, limit] : budget.at("max_per_step").items()) {
    int64_t most = 0;
    for (size_t i = 1; i < rows.size(); ++i) {
      ASSERT_TRUE(rows[i].contains(key)) << key << " missing from " << rows[i].dump();
      most = std::max(most, rows[i][key].get<int64_t>());
    }
    std::printf("%-24s max %8lld  budget %8lld\n", key.c_str(), static_cast<long long>(most),
                static_cast<long long>(limit.get<int64_t>()));
    EXPECT_LE(most, limit.get<int64_t>())
        << key << " grew past its budget (tests/tools/op_budget.json): a change that needs more "
        << "ops per step raises the budget in the same commit, saying why";
  }
  EXPECT_NE(r.output.find("op counts step " + std::to_string(steps) + ": "), std::string::npos)
      << r.output;
}

TEST(OpBudget, CountingChangesNothingComputedAndIsOffByDefault) {
  TempDir counted, plain;
  const CommandResult a =
      run_mixtrain(tiny_command(counted.path(), 3) + " --set train.count_ops=true");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const CommandResult b = run_mixtrain(tiny_command(plain.path(), 3));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto with = read_metrics(counted.file("metrics.jsonl"));
  const auto without = read_metrics(plain.file("metrics.jsonl"));
  ASSERT_EQ(with.size(), 3u);
  ASSERT_EQ(without.size(), 3u);
  for (size_t i = 0; i < with.size(); ++i) {
    nlohmann::json row = without_timing(with[i]);
    for (auto it = row.begin(); it != row.end();) {
      const std::string key = it.key();
      it = key.rfind("ops_", 0) == 0 || key.rfind("allocations_", 0) == 0 || key == "collectives"
               ? row.erase(it)
               : std::next(it);
    }
    EXPECT_EQ(row, without_timing(without[i])) << "step " << i + 1;  // loss etc. bit for bit
    EXPECT_FALSE(without[i].contains("ops_step")) << without[i].dump();
    EXPECT_GT(with[i].at("ops_forward").get<int64_t>(), 0);
    EXPECT_GT(with[i].at("ops_backward").get<int64_t>(), 0);
    EXPECT_GT(with[i].at("ops_optimizer").get<int64_t>(), 0);
    EXPECT_EQ(with[i].at("collectives").get<int64_t>(), 0);  // one process
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
