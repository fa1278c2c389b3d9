// hf_param_roles: the roles read from the decoder layout's names agree with the roles every
// registered model declares for its own parameters (CausalLM::param_roles), attention layers
// included; names outside the layout get none.
#include "mixtrain/model/hf_param_roles.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mixtrain/model/registry.h"
#include "support/tiny_model_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(HfParamRoles, EveryRegisteredModelsOwnRoles) {
  for (const std::string& name : registered_model_names()) {
    SCOPED_TRACE(name);
    ModelConfig config = test_support::tiny_config_of(name);
    config.attention_bias = true;  // every projection with a bias: more names to agree on
    const auto model = build_model(config, 1);
    std::vector<std::string> names;
    for (const auto& item : model->named_parameters()) names.push_back(item.key());
    const ParamRoles declared = model->param_roles();
    const ParamRoles read = hf_param_roles(names, &config);
    ASSERT_EQ(read.size(), declared.size());
    for (const auto& [param, info] : declared) {
      ASSERT_EQ(read.count(param), 1u) << param;
      EXPECT_EQ(read.at(param).role, info.role) << param << ": " << param_role_name(info.role);
      EXPECT_EQ(read.at(param).attention_layer, info.attention_layer) << param;
      EXPECT_EQ(read.at(param).heads.block, info.heads.block) << param;
      EXPECT_EQ(read.at(param).heads.content, info.heads.content) << param;
      EXPECT_EQ(read.at(param).heads.rotary, info.heads.rotary) << param;
    }
  }
}

TEST(HfParamRoles, AttentionLayersAndNamesOutsideTheLayout) {
  const ParamRoles roles = hf_param_roles(
      {"model.layers.12.self_attn.q_proj.weight", "model.layers.3.self_attn.o_proj.bias",
       "model.layers.x.self_attn.q_proj.weight", "encoder.layers.0.fc.weight",
       "model.layers.0.mlp.shared_expert_gate.weight"});
  ASSERT_EQ(roles.size(), 3u);
  EXPECT_EQ(roles.at("model.layers.12.self_attn.q_proj.weight").role, ParamRole::kAttentionQuery);
  EXPECT_EQ(roles.at("model.layers.12.self_attn.q_proj.weight").attention_layer,
            "model.layers.12.self_attn.");
  EXPECT_EQ(roles.at("model.layers.3.self_attn.o_proj.bias").role, ParamRole::kAttentionOutput);
  EXPECT_EQ(roles.at("model.layers.0.mlp.shared_expert_gate.weight").role, ParamRole::kRouter);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
