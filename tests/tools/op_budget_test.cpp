// The per-step op budget (issue 35): `mixtrain train --set train.count_ops=true` on
// configs/qwen2_moe_tiny.yaml must not dispatch more ATen ops or allocate more buffers per step,
// in any phase, than tests/tools/op_budget.json records. A change that needs more updates the
// file in the same commit, deliberately; one that needs fewer should lower it (the test prints
// the counts). Counting must not change what is computed.
//
// The count includes ATen's nested ops, and those depend on the path a bf16 GEMM takes
// (core/cpu_gemm.h): ATen's generic bf16 loop below AVX-512 nests thousands of ops that oneDNN
// does not. So the file has a budget per path, and each is checked with that path forced
// (MIXTRAIN_CPU_GEMM): the widened one on every machine (float32 GEMMs, whose op count is the
// same on every CPU class), the native one where this machine's own choice is native (where
// it is not, a forced native run measures ATen's slow fallback, which the engine never runs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mixtrain/core/cpu_gemm.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

std::string tiny_command(const std::string& run_dir, int steps) {
  return "train --config " + source_path("configs/qwen2_moe_tiny.yaml") + " --run-dir " + run_dir +
         " --set train.steps=" + std::to_string(steps) + " --set train.log_every=1";
}

void check_budget(const nlohmann::json& budget, const std::string& path) {
  SCOPED_TRACE("MIXTRAIN_CPU_GEMM=" + path);
  const int steps = budget.at("steps").get<int>();
  TempDir run;
  const CommandResult r = run_mixtrain(
      tiny_command(run.path(), steps) + " --set train.count_ops=true", "MIXTRAIN_CPU_GEMM=" + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("CPU GEMM: bf16 " + path), std::string::npos) << r.output;
  const auto rows = read_metrics(run.file("metrics.jsonl"));
  ASSERT_EQ(rows.size(), static_cast<size_t>(steps));
  // Step 1 creates the optimizer state (its own, larger count); the budget is for the steps
  // after it, each of which must fit (routing makes them differ).
  std::printf("path %s\n", path.c_str());
  for (const auto& [key, limit] : budget.at("max_per_step").at(path).items()) {
    int64_t most = 0;
    for (size_t i = 1; i < rows.size(); ++i) {
      ASSERT_TRUE(rows[i].contains(key)) << key << " missing from " << rows[i].dump();
      most = std::max(most, rows[i][key].get<int64_t>());
    }
    std::printf("%-24s max %8lld  budget %8lld\n", key.c_str(), static_cast<long long>(most),
                static_cast<long long>(limit.get<int64_t>()));
    EXPECT_LE(most, limit.get<int64_t>())
        << key << " grew past its budget (tests/tools/op_budget.json, " << path
        << "): a change that needs more ops per step raises the budget in the same commit, "
        << "saying why";
  }
  EXPECT_NE(r.output.find("op counts step " + std::to_string(steps) + ": "), std::string::npos)
      << r.output;
}

nlohmann::json read_budget() {
  std::ifstream file(source_path("tests/tools/op_budget.json"));
  EXPECT_TRUE(file) << "tests/tools/op_budget.json";
  return nlohmann::json::parse(file);
}

TEST(OpBudget, TinyStepStaysWithinTheWidenedPathsBudget) {
  check_budget(read_budget(), "widened");
}

TEST(OpBudget, TinyStepStaysWithinTheNativePathsBudgetWhereNativeIsChosen) {
  // The binary decides as this process does: the same CPU, the same environment.
  if (cpu_gemm_path(at::kBFloat16) == CpuGemmPath::kWidened) {
    GTEST_SKIP() << "this machine's bf16 GEMMs take the widened path, whose budget the test "
                 << "above checks; a forced native run here would count ATen's slow fallback, "
                 << "which the engine never runs: " << cpu_gemm_summary();
  }
  check_budget(read_budget(), "native");
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
