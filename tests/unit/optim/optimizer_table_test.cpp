// The optimizer table (optim/optimizer_table.h): every entry builds its leaf, the leaf's kind
// is the entry's name and its exported state carries exactly the entry's state fields; targets
// and names resolve, unknown ones are refused naming the key.
#include "mixtrain/optim/optimizer_table.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "mixtrain/core/error.h"
#include "mixtrain/optim/sgd.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(OptimizerTable, EveryEntryBuildsALeafWithItsStateFields) {
  OptimizerConfig config;
  config.options.get<SgdOptions>().momentum(0.9);  // SGD keeps a momentum buffer only with momentum
  std::set<std::string> names, targets;
  for (const OptimizerTableEntry& entry : optimizer_table()) {
    EXPECT_TRUE(names.insert(entry.name).second) << entry.name;
    EXPECT_TRUE(targets.insert(entry.target).second) << entry.target;
    EXPECT_EQ(entry.config_section, "optimizer." + entry.name + "_config");
    at::Tensor param = at::randn({4, 6}).requires_grad_(true);
    auto leaf = entry.make({{entry.lr(config), entry.weight_decay(config), {param}}}, config);
    EXPECT_EQ(leaf->kind(), entry.name);
    param.mutable_grad() = at::randn({4, 6});
    leaf->step();
    std::set<std::string> exported;
    for (const auto& [field, tensor] : leaf->export_state(param)) exported.insert(field);
    EXPECT_EQ(exported, std::set<std::string>(entry.state_fields.begin(), entry.state_fields.end()))
        << entry.name;
    EXPECT_EQ(&optimizer_for_target(entry.target), &entry);
    EXPECT_EQ(&optimizer_named(entry.name), &entry);
  }
  EXPECT_EQ(names, (std::set<std::string>{"adamw", "muon", "sgd"}));
}

TEST(OptimizerTable, UnknownTargetNamesTheKey) {
  try {
    optimizer_for_target("Lion");
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("optimizer._target_"), std::string::npos) << text;
    EXPECT_NE(text.find("SGD"), std::string::npos) << text;
    // The key apart from the problem, for the CLI to spell in the user's dialect.
    EXPECT_EQ(error.key(), "optimizer._target_");
    EXPECT_EQ(error.problem(), "unknown optimizer 'Lion' (expected AdamW, Muon, SGD)");
  }
  EXPECT_THROW(optimizer_named("lion"), std::invalid_argument);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
