// AdamW's config section (adamw_config.h): torch.optim.AdamW's defaults, the default
// optimizer._target_, and torchtitan's flat [optimizer] keys and defaults in TOML.
#include "mixtrain/optim/adamw_config.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(AdamWConfigSection, TorchDefaultsTheDefaultTargetAndTorchtitansKeys) {
  const ConfigSectionSpec spec = adamw_config_section();
  EXPECT_EQ(spec.target, "AdamW");
  EXPECT_TRUE(spec.default_target);
  EXPECT_EQ(TrainerConfig{}.optimizer.target, "AdamW");
  const torch::optim::AdamWOptions d = adamw_config(TrainerConfig{});
  EXPECT_EQ(d.lr(), 1e-3);
  EXPECT_EQ(d.betas(), std::make_tuple(0.9, 0.999));
  EXPECT_EQ(d.eps(), 1e-8);
  EXPECT_EQ(d.weight_decay(), 1e-2);

  testing::TempDir dir;
  const ResolvedConfig defaults = load_config(dir.write("d.toml", "[optimizer]\n"), {});
  EXPECT_EQ(adamw_config(defaults.config).lr(), 8e-4);
  EXPECT_EQ(adamw_config(defaults.config).weight_decay(), 0.1);
  EXPECT_EQ(adamw_config(defaults.config).betas(), std::make_tuple(0.9, 0.95));
  const ResolvedConfig set =
      load_config(dir.write("s.toml", "[optimizer]\nlr = 0.01\nbeta2 = 0.98\neps = 1e-6\n"), {});
  EXPECT_EQ(adamw_config(set.config).lr(), 0.01);
  EXPECT_EQ(adamw_config(set.config).betas(), std::make_tuple(0.9, 0.98));
  EXPECT_EQ(adamw_config(set.config).eps(), 1e-6);
  EXPECT_EQ(set.leaf("optimizer.adamw_config.adamw_betas")->origin,
            "optimizer.beta1, optimizer.beta2");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
