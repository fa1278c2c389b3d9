// `mixtrain train --nproc 2` end to end: what the log and the metrics carry from two FSDP ranks
// (Muon telemetry reduced over the ranks, the step profile's gradient-reduce phase).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

// optimizer.muon_telemetry with muon_per_head on two FSDP ranks: the log steps' rows (2 and 4
// with log_every 2) carry group 0's figures reduced over both ranks (each samples its first
// 4 matrices: 8), the other rows none, and the log shows them. The figures are checked for
// plausibility only (the unit tests check them against formulas): a zero O has error 1,
// bfloat16 asym5 leaves singular values within ~0.3 of 1, so the error is well below 1; an
// m x n O (m <= n) with singular values near 1 has RMS ~ 1/sqrt(n), so the update
// lr * 0.2 * sqrt(n) * O has RMS ~ 0.2 * lr (Muon's lr 0.02 times the schedule factor, which
// the row's lr, AdamW's 0.001 times it, gives); allowed 0.3x-1.5x of that for the band and for
// rank-deficient momentum of experts few tokens reached.
TEST(TrainCommandDistributed, MuonTelemetryOnLogStepsWithPerHeadOnTwoRanks) {
  TempDir run;
  CommandResult r =
      run_mixtrain("train --config " + source_path("configs/qwen2_moe_tiny.yaml") +
                   " --nproc 2 --set train.steps=4 --set train.log_every=2" +
                   " --set optimizer.muon_telemetry=true" +
                   " --set optimizer.muon_config.muon_per_head=true --run-dir " + run.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Muon per head: 8 attention matrices"), std::string::npos) << r.output;
  const std::vector<nlohmann::json> rows = read_metrics(run.file("metrics.jsonl"));
  ASSERT_EQ(rows.size(), 4u);
  for (const auto& row : rows) {
    SCOPED_TRACE(row.dump());
    if (row["step"].get<int64_t>() % 2 == 1) {
      EXPECT_FALSE(row.contains("muon_g0_update_rms"));
      continue;
    }
    EXPECT_EQ(row["muon_g0_ortho_sampled"].get<int64_t>(), 8);
    EXPECT_GT(row["muon_g0_ortho_error_mean"].get<double>(), 0.0);
    EXPECT_LT(row["muon_g0_ortho_error_max"].get<double>(), 0.9);
    EXPECT_GE(row["muon_g0_ortho_error_max"].get<double>(),
              row["muon_g0_ortho_error_mean"].get<double>());
    const double typical = 0.2 * 0.02 * row["lr"].get<double>() / 0.001;
    EXPECT_GT(row["muon_g0_update_rms"].get<double>(), 0.3 * typical);
    EXPECT_LT(row["muon_g0_update_rms"].get<double>(), 1.5 * typical);
  }
  EXPECT_NE(r.output.find("step 2: muon g0: ortho err "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 4: muon g0: ortho err "), std::string::npos) << r.output;
}

// train.profile on 2 ranks (FSDP, so gradients are reduce-scattered inside backward) with a
// checkpoint every 2 steps: one profile line per log_every steps, and a split in every
// metrics row whose phases are non-negative and fit in the step.
TEST(TrainCommandDistributed, ProfileSplitsTheStepInTheLogAndTheMetrics) {
  TempDir run;
  CommandResult r = run_mixtrain("train --config " + source_path("configs/qwen2_moe_tiny.yaml") +
                                 " --nproc 2 --set train.steps=4 --set train.log_every=2" +
                                 " --set train.profile=true --set checkpoint.interval=2" +
                                 " --run-dir " + run.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"profile steps 1-2: ", "profile steps 3-4: "}) {
    const size_t at = r.output.find(line);
    ASSERT_NE(at, std::string::npos) << line << "\n" << r.output;
    const std::string text = r.output.substr(at, r.output.find('\n', at) - at);
    for (const char* part : {" s/step = forward ", " | backward ", "; gradient reduce ", " | clip ",
                             " | optimizer ", " | checkpoint ", " | other ", " tok/s"}) {
      EXPECT_NE(text.find(part), std::string::npos) << part << " in " << text;
    }
  }
  EXPECT_EQ(r.output.find("profile step "), std::string::npos) << r.output;  // no odd line
  const std::vector<nlohmann::json> rows = read_metrics(run.file("metrics.jsonl"));
  ASSERT_EQ(rows.size(), 4u);
  for (const auto& row : rows) {
    SCOPED_TRACE(row.dump());
    double phases = 0;
    for (const char* key : {"forward_s", "backward_s", "reduce_s", "clip_s", "optimizer_s",
                            "checkpoint_s", "step_s"}) {
      ASSERT_TRUE(row.contains(key) && row[key].is_number()) << key;
      EXPECT_GE(row[key].get<double>(), 0.0) << key;
      if (std::string(key) != "reduce_s" && std::string(key) != "step_s")
        phases += row[key].get<double>();
    }
    const double step_s = row["step_s"].get<double>();
    EXPECT_LE(phases, step_s);
    EXPECT_GT(row["forward_s"].get<double>(), 0.0);
    EXPECT_GT(row["backward_s"].get<double>(), 0.0);
    EXPECT_GT(row["reduce_s"].get<double>(), 0.0);  // the FSDP reduce-scatters
    EXPECT_LE(row["reduce_s"].get<double>(), row["backward_s"].get<double>());
    EXPECT_GT(row["optimizer_s"].get<double>(), 0.0);
    // Checkpoints after steps 2 and 4 only.
    const bool saved = row["step"].get<int64_t>() % 2 == 0;
    EXPECT_EQ(row["checkpoint_s"].get<double>() > 0.0, saved);
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
