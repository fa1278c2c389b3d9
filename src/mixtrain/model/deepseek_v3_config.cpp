#include "mixtrain/model/deepseek_v3_config.h"

#include <utility>

#include "mixtrain/config/leaf.h"
#include "mixtrain/config/section.h"

namespace mixtrain {

MlaHeadLayouts mla_head_layouts(const ModelConfig& model) {
  const DeepseekV3Config& d = deepseek_v3_config(model);
  return {{d.qk_nope_head_dim + d.qk_rope_head_dim, d.qk_nope_head_dim, d.qk_rope_head_dim},
          {d.qk_nope_head_dim + d.v_head_dim, d.qk_nope_head_dim, 0},
          {d.v_head_dim, 0, 0}};
}

#define MIXTRAIN_DSV3_LEAF(field) \
  field_leaf(                     \
      "model." #field, [](auto& c) -> auto& { return deepseek_v3_config(c.model).field; })

void register_deepseek_v3_config_section() {
  ConfigSectionSpec spec;
  spec.name = "deepseek_v3";
  spec.slot = "model";
  spec.leaves = {
      MIXTRAIN_DSV3_LEAF(q_lora_rank),
      MIXTRAIN_DSV3_LEAF(kv_lora_rank),
      MIXTRAIN_DSV3_LEAF(qk_nope_head_dim),
      MIXTRAIN_DSV3_LEAF(qk_rope_head_dim),
      MIXTRAIN_DSV3_LEAF(v_head_dim),
      MIXTRAIN_DSV3_LEAF(rope_interleave),
      MIXTRAIN_DSV3_LEAF(n_shared_experts),
      MIXTRAIN_DSV3_LEAF(n_group),
      MIXTRAIN_DSV3_LEAF(topk_group),
      MIXTRAIN_DSV3_LEAF(routed_scaling_factor),
      MIXTRAIN_DSV3_LEAF(first_k_dense_replace),
      MIXTRAIN_DSV3_LEAF(bias_update_speed),
  };
  register_config_section(std::move(spec));
}

#undef MIXTRAIN_DSV3_LEAF

}  // namespace mixtrain
