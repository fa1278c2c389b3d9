#include "mixtrain/config/dialect_defaults.h"

#include <gtest/gtest.h>

#include "mixtrain/config/load.h"
#include "mixtrain/config/schema.h"
#include "mixtrain/core/error.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/muon_config.h"
#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::TempDir;

// Exact comparisons: every value below is a decimal constant written in a default, copied
// (never computed), so it is the same double.

TEST(DialectDefaultsTest, YamlIsTorchAdamWAndHyperParallelMuon) {
  const TrainerConfig c = dialect_default_config("yaml");
  EXPECT_EQ(c.dialect, "yaml");
  EXPECT_EQ(c.optimizer.routing, "yaml");
  // torch.optim.AdamW: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01.
  EXPECT_EQ(adamw_config(c).lr(), 1e-3);
  EXPECT_EQ(std::get<0>(adamw_config(c).betas()), 0.9);
  EXPECT_EQ(std::get<1>(adamw_config(c).betas()), 0.999);
  EXPECT_EQ(adamw_config(c).eps(), 1e-8);
  EXPECT_EQ(adamw_config(c).weight_decay(), 0.01);
  // hyper-parallel's Muon (docs/architecture.md §5): lr 0.02, momentum 0.95 (sum, Nesterov), rms
  // 0.2.
  EXPECT_EQ(muon_config(c).options.lr(), 0.02);
  EXPECT_EQ(muon_config(c).options.momentum(), 0.95);
  EXPECT_EQ(muon_config(c).options.momentum_style(), MomentumStyle::kSum);
  EXPECT_TRUE(muon_config(c).options.nesterov());
  EXPECT_EQ(muon_config(c).options.matched_adamw_rms(), 0.2);
}

TEST(DialectDefaultsTest, TomlIsTorchtitanWithItsDerivations) {
  const TrainerConfig c = dialect_default_config("toml");
  EXPECT_EQ(c.dialect, "toml");
  EXPECT_EQ(c.optimizer.routing, "toml");
  // torchtitan: lr 8e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1.
  EXPECT_EQ(adamw_config(c).lr(), 8e-4);
  EXPECT_EQ(std::get<0>(adamw_config(c).betas()), 0.9);
  EXPECT_EQ(std::get<1>(adamw_config(c).betas()), 0.95);
  EXPECT_EQ(adamw_config(c).eps(), 1e-8);
  EXPECT_EQ(adamw_config(c).weight_decay(), 0.1);
  // torchtitan-npu's Muon: weight decay and ns epsilon shared with AdamW's, ema_add momentum,
  // matched_adamw_rms 0.18, legacy coefficients without muon_hybrid_ns, and (adjust_lr_fn
  // match_rms_adamw) the AdamW lr.
  EXPECT_EQ(muon_config(c).options.weight_decay(), 0.1);
  EXPECT_EQ(muon_config(c).options.ns_epsilon(), 1e-8);
  EXPECT_EQ(muon_config(c).options.momentum_style(), MomentumStyle::kEmaAdd);
  EXPECT_EQ(muon_config(c).options.matched_adamw_rms(), 0.18);
  EXPECT_EQ(muon_config(c).options.ns_variant(), "legacy");
  EXPECT_EQ(muon_config(c).options.adjust_lr_fn(), AdjustLrFn::kMatchRmsAdamw);
  EXPECT_EQ(muon_config(c).options.lr(), 8e-4);
}

// Independent route: an empty file through load_config gives the same value for every leaf
// (but the file name).
TEST(DialectDefaultsTest, EqualsAnEmptyFileOfTheDialect) {
  TempDir dir;
  for (const std::string dialect : {"yaml", "toml"}) {
    const ResolvedConfig loaded = load_config(dir.write("empty." + dialect, ""), {});
    const TrainerConfig defaults = dialect_default_config(dialect);
    for (const LeafSpec& spec : canonical_leaves()) {
      if (spec.key == "source_file") continue;
      EXPECT_EQ(spec.format(defaults), spec.format(loaded.config)) << dialect << " " << spec.key;
    }
  }
}

TEST(DialectDefaultsTest, UnknownDialectIsRefused) {
  try {
    dialect_default_config("json");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "dialect: unknown config dialect 'json' (expected yaml or toml)");
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
