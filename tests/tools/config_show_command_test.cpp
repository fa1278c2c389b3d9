// `mixtrain config show`: the shipped configs resolve, every leaf carries its source, and
// invalid configs exit 2 with one line naming the file and key.
#include <gtest/gtest.h>

#include <fstream>

#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

bool has_line_with(const std::string& text, const std::string& a, const std::string& b) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (line.find(a) != std::string::npos && line.find(b) != std::string::npos) return true;
    start = end + 1;
  }
  return false;
}

TEST(ConfigShowCommand, RfcYamlConfigResolves) {
  CommandResult r = run_mixtrain("config show " + source_path("configs/qwen2_moe_tiny.yaml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has_line_with(r.output, "optimizer.fp32_main_params", "file")) << r.output;
  EXPECT_TRUE(has_line_with(r.output, "optimizer.muon_config.muon_ns_variant", "asym5"));
  EXPECT_TRUE(has_line_with(r.output, "fsdp_config.mix_precision.reduce_dtype", "float32"));
  EXPECT_TRUE(has_line_with(r.output, "optimizer.adamw_config.adamw_eps", "default"));
}

TEST(ConfigShowCommand, MuonTomlExampleResolvesWithDerivedValues) {
  CommandResult r = run_mixtrain("config show " + source_path("configs/qwen2_moe_tiny.toml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has_line_with(r.output, "optimizer.muon_config.muon_ns_variant", "hybrid"));
  EXPECT_TRUE(has_line_with(r.output, "optimizer.muon_config.muon_momentum_style", "derived"));
}

TEST(ConfigShowCommand, SetOverridesAreMarked) {
  CommandResult r = run_mixtrain("config show " + source_path("configs/qwen2_moe_tiny.yaml") +
                                 " --set train.steps=7");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has_line_with(r.output, "train.steps", "--set")) << r.output;
}

TEST(ConfigShowCommand, Fp32MainParamsWithBf16ReduceNamesBothKeys) {
  CommandResult r = run_mixtrain("config show " + source_path("configs/qwen2_moe_tiny.yaml") +
                                 " --set fsdp_config.mix_precision.reduce_dtype=bfloat16");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.fp32_main_params"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fsdp_config.mix_precision.reduce_dtype"), std::string::npos);
}

TEST(ConfigShowCommand, UnknownKeyInFileNamesFileKeyAndSuggestion) {
  TempDir dir;
  {
    std::ofstream out(dir.file("typo.yaml"));
    out << "train:\n  stpes: 3\n";
  }
  CommandResult r = run_mixtrain("config show " + dir.file("typo.yaml"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(dir.file("typo.yaml")), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("train.stpes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("train.steps"), std::string::npos) << r.output;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
