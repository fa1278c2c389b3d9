#include "mixtrain/config/startup_log.h"

#include <gtest/gtest.h>

#include <sstream>

#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::TempDir;

std::vector<std::string> cells_of_row(const std::string& block, const std::string& name) {
  std::istringstream in(block);
  for (std::string line; std::getline(in, line);) {
    std::istringstream row(line);
    std::vector<std::string> cells;
    for (std::string cell; row >> cell;) cells.push_back(cell);
    if (!cells.empty() && cells[0] == name) return cells;
  }
  return {};
}

TEST(StartupLogTest, TrainerConfigBlockHasEveryLeaf) {
  TempDir dir;
  const ResolvedConfig r = load_config(dir.write("rfc.yaml", testing::kRfcSection1Yaml), {});
  const std::string block = format_trainer_config_block(r);
  EXPECT_EQ(block.rfind("Trainer config:\n", 0), 0u);
  EXPECT_EQ(cells_of_row(block, "model_init_dtype"),
            (std::vector<std::string>{"model_init_dtype", "bfloat16", "file"}));
  EXPECT_EQ(cells_of_row(block, "optimizer.fp32_main_params"),
            (std::vector<std::string>{"optimizer.fp32_main_params", "true", "file"}));
  // Defaults are shown too: the AdamW-only config leaves model_init_dtype unset.
  const ResolvedConfig empty = load_config(dir.write("e.yaml", ""), {});
  const std::string defaults = format_trainer_config_block(empty);
  EXPECT_EQ(cells_of_row(defaults, "model_init_dtype"),
            (std::vector<std::string>{"model_init_dtype", "null", "default"}));
  EXPECT_EQ(cells_of_row(defaults, "optimizer.fp32_main_params"),
            (std::vector<std::string>{"optimizer.fp32_main_params", "false", "default"}));
}

TEST(StartupLogTest, ModelConfigBlock) {
  ModelConfig model;
  model.num_layers = 3;
  const std::string block = format_model_config_block(model);
  EXPECT_EQ(block.rfind("Model config:\n", 0), 0u);
  EXPECT_NE(block.find("  num_layers: 3\n"), std::string::npos);
  EXPECT_NE(block.find("  name: qwen2_moe\n"), std::string::npos);
  EXPECT_NE(block.find("  rms_norm_eps: 1e-06\n"), std::string::npos);
}

// Only the keys the model reads (config/model_sections.h).
TEST(StartupLogTest, ModelConfigBlockListsTheModelsOwnKeys) {
  ModelConfig model;
  const std::string moe = format_model_config_block(model);
  EXPECT_NE(moe.find("  num_experts: 4\n"), std::string::npos);
  EXPECT_EQ(moe.find("  intermediate_size:"), std::string::npos);
  model.name = "qwen2";
  const std::string dense = format_model_config_block(model);
  EXPECT_NE(dense.find("  intermediate_size: 128\n"), std::string::npos);
  EXPECT_NE(dense.find("  head_dim: 16\n"), std::string::npos);
  EXPECT_EQ(dense.find("  num_experts:"), std::string::npos);
  EXPECT_EQ(dense.find("  router_aux_loss_coef:"), std::string::npos);
}

TEST(StartupLogTest, EffectiveAdamwDefaultConfiguredFinal) {
  TempDir dir;
  const ResolvedConfig r = load_config(dir.write("rfc.yaml", testing::kRfcSection1Yaml), {});
  const std::string block = format_effective_adamw_block(r);
  EXPECT_EQ(block.rfind("Effective adamw config:\n", 0), 0u);
  EXPECT_EQ(
      cells_of_row(block, "parameter"),
      (std::vector<std::string>{"parameter", "constructor", "default", "configured", "final"}));
  // torch.optim.AdamW default lr 1e-3; the §1 config sets 0.001; final 0.001.
  EXPECT_EQ(cells_of_row(block, "adamw_lr"),
            (std::vector<std::string>{"adamw_lr", "0.001", "0.001", "(file)", "0.001"}));
  // Weight decay 0.01 is both the default and the configured value.
  EXPECT_EQ(cells_of_row(block, "adamw_weight_decay"),
            (std::vector<std::string>{"adamw_weight_decay", "0.01", "0.01", "(file)", "0.01"}));
  // Not configured: "-", final = default.
  EXPECT_EQ(cells_of_row(block, "adamw_eps"),
            (std::vector<std::string>{"adamw_eps", "1e-08", "-", "1e-08"}));
}

TEST(StartupLogTest, EffectiveMuonDefaultConfiguredFinal) {
  TempDir dir;
  const ResolvedConfig r = load_config(dir.write("rfc.yaml", testing::kRfcSection1Yaml), {});
  const std::string block = format_effective_muon_block(r);
  EXPECT_EQ(block.rfind("Effective muon config:\n", 0), 0u);
  EXPECT_EQ(cells_of_row(block, "muon_lr"),
            (std::vector<std::string>{"muon_lr", "0.02", "0.02", "(file)", "0.02"}));
  EXPECT_EQ(cells_of_row(block, "muon_ns_variant"),
            (std::vector<std::string>{"muon_ns_variant", "asym5", "asym5", "(file)", "asym5"}));
  EXPECT_EQ(cells_of_row(block, "muon_matched_adamw_rms"),
            (std::vector<std::string>{"muon_matched_adamw_rms", "0.2", "-", "0.2"}));
  EXPECT_EQ(cells_of_row(block, "muon_normuon"),
            (std::vector<std::string>{"muon_normuon", "false", "-", "false"}));
  EXPECT_EQ(cells_of_row(block, "muon_normuon_beta2"),
            (std::vector<std::string>{"muon_normuon_beta2", "0.95", "-", "0.95"}));
  EXPECT_EQ(cells_of_row(block, "muon_normuon_epsilon"),
            (std::vector<std::string>{"muon_normuon_epsilon", "1e-10", "-", "1e-10"}));
  EXPECT_EQ(cells_of_row(block, "muon_cautious_weight_decay"),
            (std::vector<std::string>{"muon_cautious_weight_decay", "false", "-", "false"}));
  // optimizer.muon_telemetry lives beside muon_config but belongs to this block.
  EXPECT_EQ(cells_of_row(block, "muon_per_head"),
            (std::vector<std::string>{"muon_per_head", "false", "-", "false"}));
  EXPECT_EQ(cells_of_row(block, "muon_telemetry"),
            (std::vector<std::string>{"muon_telemetry", "false", "-", "false"}));
}

TEST(StartupLogTest, EffectiveMuonShowsTomlDerivations) {
  TempDir dir;
  const ResolvedConfig r = load_config(
      dir.write("c.toml", "[optimizer]\nname = \"Muon\"\nlr = 1e-4\nmuon_lr = 1e-2\n"), {});
  const std::string block = format_effective_muon_block(r);
  // TOML's constructor default: optimizer.lr's default 8e-4 (an empty TOML file's Muon lr);
  // derived from optimizer.lr (muon_lr ignored); final 1e-4.
  const auto lr = cells_of_row(block, "muon_lr");
  ASSERT_GE(lr.size(), 4u);
  EXPECT_EQ(lr[1], "0.0008");
  EXPECT_EQ(lr[2], "derived");
  EXPECT_EQ(lr.back(), "0.0001");
  EXPECT_NE(block.find("optimizer.muon_lr = 0.01 ignored"), std::string::npos);
  const auto rms = cells_of_row(block, "muon_matched_adamw_rms");
  ASSERT_GE(rms.size(), 3u);
  // torchtitan-npu's constant is both TOML's default and the final value (the YAML default
  // 0.2 is not what a TOML user gets).
  EXPECT_EQ(rms[1], "0.18");
  EXPECT_EQ(rms.back(), "0.18");
  const auto style = cells_of_row(block, "muon_momentum_style");
  ASSERT_GE(style.size(), 2u);
  EXPECT_EQ(style[1], "ema_add");
}

TEST(StartupLogTest, MuonNotUsedWithAdamW) {
  TempDir dir;
  const ResolvedConfig r = load_config(dir.write("a.yaml", "optimizer:\n  _target_: AdamW\n"), {});
  EXPECT_EQ(format_effective_muon_block(r),
            "Effective muon config: not used (optimizer._target_ is AdamW)\n");
  // QK-clip's key sits under muon_config but acts after any optimizer's step: the block says so.
  const ResolvedConfig clip = load_config(
      dir.write("b.yaml",
                "optimizer:\n  _target_: AdamW\n  muon_config:\n    muon_qk_clip_tau: 50\n"),
      {});
  EXPECT_EQ(format_effective_muon_block(clip),
            "Effective muon config: not used (optimizer._target_ is AdamW); muon_qk_clip_tau 50 "
            "applies all the same: QK-clip runs after every step\n");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
