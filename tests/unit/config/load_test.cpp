#include "mixtrain/config/load.h"

#include <gtest/gtest.h>

#include "mixtrain/config/schema.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/muon_config.h"
#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::config_error_of;
using testing::TempDir;

const ResolvedLeaf& leaf(const ResolvedConfig& resolved, const std::string& key) {
  for (const ResolvedLeaf& l : resolved.leaves) {
    if (l.key == key) return l;
  }
  throw std::runtime_error("no leaf " + key);
}

TEST(LoadTest, RfcSection1SeedLoadsWithSources) {
  TempDir dir;
  const ResolvedConfig r = load_config(dir.write("rfc.yaml", testing::kRfcSection1Yaml), {});
  EXPECT_EQ(r.config.optimizer.target, "Muon");
  EXPECT_EQ(leaf(r, "optimizer._target_").value, "Muon");
  EXPECT_EQ(leaf(r, "optimizer._target_").source, ValueSource::kFile);
  EXPECT_EQ(leaf(r, "model_init_dtype").value, "bfloat16");
  EXPECT_EQ(leaf(r, "optimizer.fp32_main_params").value, "true");
  EXPECT_EQ(leaf(r, "fsdp_config.mix_precision.reduce_dtype").value, "float32");
  EXPECT_EQ(leaf(r, "optimizer.adamw_config.adamw_eps").source, ValueSource::kDefault);
  EXPECT_EQ(leaf(r, "optimizer.adamw_config.adamw_eps").value, "1e-08");
  EXPECT_EQ(leaf(r, "optimizer.routing").source, ValueSource::kDerived);
  EXPECT_EQ(r.leaves.size(), canonical_leaves().size());  // every leaf of the tree
}

TEST(LoadTest, MuonSeedExamplesLoad) {
  TempDir dir;
  for (const char* text :
       {testing::kMuonExample1Toml, testing::kMuonExample2Toml, testing::kMuonExample3Toml}) {
    const ResolvedConfig r = load_config(dir.write("e.toml", text), {});
    EXPECT_EQ(r.config.optimizer.target, "Muon");
    EXPECT_EQ(r.config.dialect, "toml");
  }
  const ResolvedConfig r1 = load_config(dir.write("e1.toml", testing::kMuonExample1Toml), {});
  EXPECT_EQ(leaf(r1, "optimizer.muon_config.muon_lr").value, "0.00022");
  EXPECT_EQ(leaf(r1, "optimizer.muon_config.muon_lr").source, ValueSource::kDerived);
  EXPECT_EQ(leaf(r1, "optimizer.adamw_config.adamw_lr").origin, "optimizer.lr");
}

TEST(LoadTest, ShippedConfigsLoad) {
  const std::string root = MIXTRAIN_SOURCE_DIR;
  const ResolvedConfig yaml = load_config(root + "/configs/qwen2_moe_tiny.yaml", {});
  EXPECT_EQ(yaml.config.optimizer.target, "Muon");
  EXPECT_TRUE(yaml.config.optimizer.fp32_main_params);
  const ResolvedConfig toml = load_config(root + "/configs/qwen2_moe_tiny.toml", {});
  EXPECT_EQ(muon_config(toml.config).options.ns_variant(), "hybrid");
  const ResolvedConfig adamw = load_config(root + "/configs/qwen2_moe_tiny_adamw.yaml", {});
  EXPECT_EQ(adamw.config.optimizer.target, "AdamW");
  EXPECT_FALSE(adamw.config.optimizer.fp32_main_params);
  EXPECT_EQ(adamw.config.model_init_dtype.value_or(""), "float32");
  EXPECT_EQ(adamw.config.mix_precision.reduce_dtype.value_or(""), "float32");
  EXPECT_EQ(adamw.config.train.steps, 100);
}

TEST(LoadTest, DialectFromExtension) {
  TempDir dir;
  EXPECT_EQ(load_config(dir.write("a.yml", ""), {}).config.dialect, "yaml");
  const std::string json = dir.write("a.json", "{}");
  EXPECT_EQ(config_error_of([&] { load_config(json, {}); }),
            json + ": unknown config format (expected a .yaml, .yml or .toml file)");
  const std::string missing = dir.path() + "/nope.toml";
  EXPECT_EQ(config_error_of([&] { load_config(missing, {}); }),
            missing + ": cannot open the config file (missing or unreadable)");
}

TEST(LoadTest, SetOverridesYamlKeysWithYamlValues) {
  TempDir dir;
  const std::string path = dir.write("c.yaml", "train:\n  steps: 100\n");
  const ResolvedConfig r =
      load_config(path, {"train.steps=30", "optimizer.adamw_config.adamw_betas=[0.8,0.9]",
                         "model_init_dtype=bfloat16", "optimizer.muon_config.muon_lr=0.05"});
  EXPECT_EQ(r.config.train.steps, 30);
  EXPECT_EQ(leaf(r, "train.steps").source, ValueSource::kOverride);
  EXPECT_EQ(std::get<0>(adamw_config(r.config).betas()), 0.8);
  EXPECT_EQ(std::get<1>(adamw_config(r.config).betas()), 0.9);
  EXPECT_EQ(leaf(r, "optimizer.adamw_config.adamw_betas").source, ValueSource::kOverride);
  EXPECT_EQ(r.config.model_init_dtype.value_or(""), "bfloat16");
  EXPECT_EQ(muon_config(r.config).options.lr(), 0.05);  // section absent from the file: created
  EXPECT_EQ(leaf(r, "model.vocab_size").source, ValueSource::kDefault);
  // The last --set of a key wins.
  EXPECT_EQ(load_config(path, {"train.steps=3", "train.steps=4"}).config.train.steps, 4);
}

TEST(LoadTest, SetErrors) {
  TempDir dir;
  const std::string path = dir.write("c.yaml", "");
  EXPECT_EQ(config_error_of([&] { load_config(path, {"optimizer.muon_config.muon_lrr=1"}); }),
            "--set: optimizer.muon_config.muon_lrr: unknown key (did you mean "
            "optimizer.muon_config.muon_lr?)");
  EXPECT_EQ(config_error_of([&] { load_config(path, {"train.steps=ten"}); }),
            "--set: train.steps: expected an integer, got string 'ten'");
  EXPECT_EQ(config_error_of([&] { load_config(path, {"train.steps=2.5"}); }),
            "--set: train.steps: expected an integer, got number 2.5");
  EXPECT_EQ(
      config_error_of([&] { load_config(path, {"optimizer.adamw_config.adamw_betas=[0.9]"}); }),
      "--set: optimizer.adamw_config.adamw_betas: expected a list of 2 numbers, got a list of 1 "
      "items");
  EXPECT_EQ(config_error_of([&] { load_config(path, {"train.steps"}); }),
            "--set: 'train.steps': expected key=value (e.g. train.steps=30)");
  EXPECT_NE(config_error_of([&] {
              load_config(path, {"train.steps=[1"});
            }).find("--set: train.steps: cannot parse value '[1'"),
            std::string::npos);
  // A section is not a key.
  EXPECT_EQ(config_error_of([&] {
              load_config(path, {"optimizer.muon_config=1"});
            }).rfind("--set: optimizer.muon_config", 0),
            0u);
}

TEST(LoadTest, SetOnTomlUsesTomlKeys) {
  TempDir dir;
  const std::string path = dir.write("c.toml", testing::kMuonExample1Toml);
  const ResolvedConfig r = load_config(path, {"optimizer.lr=1e-3", "training.steps=7"});
  EXPECT_EQ(adamw_config(r.config).lr(), 1e-3);
  EXPECT_EQ(muon_config(r.config).options.lr(), 1e-3);  // derived from the overridden lr
  EXPECT_EQ(leaf(r, "optimizer.adamw_config.adamw_lr").source, ValueSource::kOverride);
  EXPECT_EQ(leaf(r, "optimizer.muon_config.muon_lr").source, ValueSource::kDerived);
  EXPECT_EQ(r.config.train.steps, 7);
  EXPECT_EQ(config_error_of([&] { load_config(path, {"optimizer.adamw_config.adamw_lr=1"}); }),
            "--set: optimizer.adamw_config.adamw_lr: unknown key (did you mean optimizer.lr?)");
  EXPECT_EQ(config_error_of([&] { load_config(path, {"optimizer.muon_hybrid_ns=1"}); }),
            "--set: optimizer.muon_hybrid_ns: expected true or false, got integer 1");
}

TEST(LoadTest, WarnsOnceWhenTomlMuonLrIsIgnored) {
  TempDir dir;
  const std::string path =
      dir.write("c.toml", "[optimizer]\nname = \"Muon\"\nlr = 1e-4\nmuon_lr = 1e-2\n");
  const int before = warning_count();
  const ResolvedConfig r = load_config(path, {});
  EXPECT_EQ(warning_count(), before + 1);
  EXPECT_EQ(muon_config(r.config).options.lr(), 1e-4);
  const ResolvedConfig original = load_config(path, {"optimizer.muon_adjust_lr_fn=original"});
  EXPECT_EQ(muon_config(original.config).options.lr(), 1e-2);
  EXPECT_EQ(warning_count(), before + 1);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
