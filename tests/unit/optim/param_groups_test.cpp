#include "mixtrain/optim/param_groups.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(ParamGroups, BiasNormAndLnNamesGetNoDecay) {
  EXPECT_TRUE(is_no_decay_parameter("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_TRUE(is_no_decay_parameter("model.layers.0.input_layernorm.weight"));
  EXPECT_TRUE(is_no_decay_parameter("model.norm.weight"));
  EXPECT_TRUE(is_no_decay_parameter("h.0.ln_1.weight"));
  EXPECT_FALSE(is_no_decay_parameter("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(is_no_decay_parameter("model.embed_tokens.weight"));
  EXPECT_FALSE(is_no_decay_parameter("model.layers.0.mlp.experts.gate_proj"));
}

TEST(ParamGroups, SplitKeepsModelOrderAndSkipsFrozenParameters) {
  at::Tensor w1 = at::zeros({2, 2}).requires_grad_();
  at::Tensor b1 = at::zeros({2}).requires_grad_();
  at::Tensor frozen = at::zeros({2, 2});
  at::Tensor w2 = at::zeros({2, 2}).requires_grad_();
  NamedParameters params = {
      {"a.weight", w1}, {"a.bias", b1}, {"f.weight", frozen}, {"b.weight", w2}};
  DecaySplit split = split_by_weight_decay(params);
  ASSERT_EQ(split.decay.size(), 2u);
  EXPECT_EQ(split.decay[0].first, "a.weight");
  EXPECT_EQ(split.decay[1].first, "b.weight");
  EXPECT_TRUE(split.decay[1].second.is_same(w2));
  ASSERT_EQ(split.no_decay.size(), 1u);
  EXPECT_EQ(split.no_decay[0].first, "a.bias");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
