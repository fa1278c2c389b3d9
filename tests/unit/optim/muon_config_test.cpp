// Muon's config section (muon_config.h): its keys are muon_option_fields() and the trainer's
// extras, in that order, under optimizer.muon_config.muon_* with their TOML spellings; the
// cross-key rules and the torchtitan-npu derivations come from the section, through
// load_config as a user meets them.
#include "mixtrain/optim/muon_config.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mixtrain/config/schema.h"
#include "mixtrain/config/toml_front_end.h"
#include "mixtrain/optim/option_fields.h"
#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(MuonConfigSection, KeysAreTheFieldsThenTheExtrasWithTheirTomlSpellings) {
  const ConfigSectionSpec spec = muon_config_section();
  EXPECT_EQ(spec.target, "Muon");
  std::vector<std::string> expected;
  for (const auto& field : muon_option_fields()) {
    expected.push_back("optimizer.muon_config.muon_" + field.name);
  }
  for (const char* extra :
       {"optimizer.muon_config.muon_per_head", "optimizer.muon_telemetry",
        "optimizer.muon_config.muon_qk_clip_tau", "optimizer.muon_config.muon_adamw_keywords"}) {
    expected.push_back(extra);
  }
  std::vector<std::string> keys;
  for (const LeafSpec& leaf : spec.leaves) keys.push_back(leaf.key);
  EXPECT_EQ(keys, expected);
  // The registered leaves are the same, in the same order, in the canonical list.
  std::vector<std::string> registered;
  for (const LeafSpec& leaf : canonical_leaves()) {
    if (leaf.key.rfind("optimizer.muon_", 0) == 0) registered.push_back(leaf.key);
  }
  EXPECT_EQ(registered, expected);
  EXPECT_EQ(toml_key_for("optimizer.muon_config.muon_momentum"), "optimizer.muon_momentum");
  EXPECT_EQ(toml_key_for("optimizer.muon_config.muon_nesterov"), "optimizer.muon_enable_nesterov");
  EXPECT_EQ(toml_key_for("optimizer.muon_config.muon_lr"), "optimizer.muon_lr");  // its own
  EXPECT_EQ(toml_key_for("optimizer.muon_config.muon_matched_adamw_rms"), "");    // derived
}

TEST(MuonConfigSection, CrossKeyRulesAndTheTomlDerivations) {
  testing::TempDir dir;
  const std::string custom =
      dir.write("c.yaml",
                "optimizer:\n  _target_: Muon\n  muon_config:\n    muon_ns_variant: custom\n"
                "    muon_ns_steps: 2\n    muon_ns_coefficients: [[3.0, -3.2, 1.2]]\n");
  EXPECT_EQ(testing::config_error_of([&] { load_config(custom, {}); }),
            custom +
                ": optimizer.muon_config.muon_ns_coefficients: has 1 [a, b, c] triples but "
                "muon_ns_steps is 2; give one triple per step");
  const std::string telemetry =
      dir.write("t.yaml", "optimizer:\n  _target_: AdamW\n  muon_telemetry: true\n");
  EXPECT_NE(testing::config_error_of([&] {
              load_config(telemetry, {});
            }).find("optimizer.muon_telemetry: needs optimizer._target_ Muon"),
            std::string::npos);

  // torchtitan-npu: eps and weight_decay shared with AdamW, ema_add, 0.18, lr from lr.
  const ResolvedConfig toml =
      load_config(dir.write("m.toml",
                            "[optimizer]\nname = \"Muon\"\nlr = 0.003\neps = 1e-9\n"
                            "weight_decay = 0.05\n"),
                  {});
  const MuonOptions& m = muon_config(toml.config).options;
  EXPECT_EQ(m.lr(), 0.003);
  EXPECT_EQ(m.ns_epsilon(), 1e-9);
  EXPECT_EQ(m.weight_decay(), 0.05);
  EXPECT_EQ(m.momentum_style(), MomentumStyle::kEmaAdd);
  EXPECT_EQ(m.matched_adamw_rms(), 0.18);
  EXPECT_EQ(m.ns_variant(), "legacy");
  EXPECT_EQ(toml.leaf("optimizer.muon_config.muon_lr")->origin,
            "optimizer.lr (muon_adjust_lr_fn = match_rms_adamw)");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
