// SGD's config section (sgd_config.h): torch.optim.SGD's defaults and refusals under
// optimizer.sgd_config.sgd_*, and no TOML dialect.
#include "mixtrain/optim/sgd_config.h"

#include <gtest/gtest.h>

#include <string>

#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(SgdConfigSection, TorchDefaultsRefusalsAndNoToml) {
  const ConfigSectionSpec spec = sgd_config_section();
  EXPECT_EQ(spec.target, "SGD");
  EXPECT_FALSE(spec.in_toml_dialect);
  const SgdOptions defaults = sgd_config(TrainerConfig{});
  EXPECT_EQ(defaults.lr(), 1e-3);
  EXPECT_EQ(defaults.momentum(), 0.0);
  EXPECT_EQ(defaults.dampening(), 0.0);
  EXPECT_EQ(defaults.weight_decay(), 0.0);
  EXPECT_FALSE(defaults.nesterov());

  testing::TempDir dir;
  const ResolvedConfig ok =
      load_config(dir.write("ok.yaml",
                            "optimizer:\n  _target_: SGD\n  sgd_config:\n    sgd_momentum: 0.9\n"
                            "    sgd_nesterov: true\n"),
                  {});
  EXPECT_EQ(sgd_config(ok.config).momentum(), 0.9);
  const std::string nesterov =
      dir.write("n.yaml", "optimizer:\n  _target_: SGD\n  sgd_config:\n    sgd_nesterov: true\n");
  EXPECT_EQ(testing::config_error_of([&] { load_config(nesterov, {}); }),
            nesterov +
                ": optimizer.sgd_config.sgd_nesterov: requires sgd_momentum > 0 and "
                "sgd_dampening 0 (as torch.optim.SGD)");
  const std::string toml = dir.write("s.toml", "[optimizer]\nname = \"SGD\"\n");
  EXPECT_NE(testing::config_error_of([&] {
              load_config(toml, {});
            }).find("optimizer.name: \"SGD\" is not available in the TOML dialect"),
            std::string::npos);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
