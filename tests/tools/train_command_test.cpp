// `mixtrain train` end to end: the "must show" run and its failure modes.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace {

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

TEST(TrainCommand, ThirtyStepsOfTheAdamWConfigCutTheLossByTenPercent) {
  TempDir run;
  CommandResult r = run_mixtrain("train --config " + source_path("configs/qwen2_moe_tiny_adamw.yaml") +
                                 " --set train.steps=30 --run-dir " + run.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> rows = read_metrics(run.file("metrics.jsonl"));
  ASSERT_EQ(rows.size(), 30u);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i]["step"].get<int64_t>(), static_cast<int64_t>(i + 1));
    for (const char* key : {"loss", "grad_norm", "lr", "tokens_per_s", "elapsed_s"}) {
      EXPECT_TRUE(rows[i][key].is_number()) << key << " in row " << i;
    }
  }
  const double first = rows.front()["loss"].get<double>();
  const double last = rows.back()["loss"].get<double>();
  EXPECT_LE(last, 0.9 * first) << "first " << first << " last " << last;
  EXPECT_TRUE(std::filesystem::exists(run.file("loss.svg")));
  // The four start-up blocks of the RFC's section 10.
  for (const char* block : {"Trainer config", "Model config", "Effective adamw config",
                            "Effective muon config"}) {
    EXPECT_NE(r.output.find(block), std::string::npos) << block;
  }
  EXPECT_NE(r.output.find(run.file("metrics.jsonl")), std::string::npos);
}

TEST(TrainCommand, BadOverrideExitsTwoBeforeWritingAnything) {
  TempDir run;
  CommandResult r = run_mixtrain("train --config " + source_path("configs/qwen2_moe_tiny_adamw.yaml") +
                                 " --set train.stepz=3 --run-dir " + run.file("out"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train.stepz"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(run.file("out")));
}

TEST(TrainCommand, MissingConfigFileIsAConfigError) {
  CommandResult r = run_mixtrain("train --config /nonexistent/x.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/x.yaml"), std::string::npos) << r.output;
}

TEST(TrainCommand, UnknownFlagExitsTwo) {
  CommandResult r = run_mixtrain("train --config x.yaml --bogus");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

TEST(TrainCommand, MuonConfigIsRefusedNotFaked) {
  TempDir run;
  CommandResult r = run_mixtrain("train --config " + source_path("configs/qwen2_moe_tiny.yaml") +
                                 " --run-dir " + run.file("out"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer._target_"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(run.file("out/metrics.jsonl")));
}

TEST(TrainCommand, BadTokenFileNamesTheFile) {
  TempDir run;
  {
    std::ofstream bad(run.file("bad.bin"), std::ios::binary);
    bad << "not a token shard";
  }
  CommandResult r = run_mixtrain("train --config " + source_path("configs/qwen2_moe_tiny_adamw.yaml") +
                                 " --set data.kind=tokens --set data.path=" + run.file("bad.bin") +
                                 " --run-dir " + run.file("out"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(run.file("bad.bin")), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mixtrain::testing
