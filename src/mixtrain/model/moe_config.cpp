#include "mixtrain/model/moe_config.h"

#include "mixtrain/config/leaf.h"
#include "mixtrain/config/section.h"

namespace mixtrain {

#define MIXTRAIN_MOE_LEAF(field) \
  field_leaf(                    \
      "model." #field, [](auto& c) -> auto& { return moe_config(c.model).field; })

void register_moe_config_section() {
  ConfigSectionSpec spec;
  spec.name = "moe";
  spec.slot = "model";
  spec.leaves = {
      MIXTRAIN_MOE_LEAF(moe_intermediate_size), MIXTRAIN_MOE_LEAF(num_experts),
      MIXTRAIN_MOE_LEAF(num_experts_per_tok),   MIXTRAIN_MOE_LEAF(shared_expert_intermediate_size),
      MIXTRAIN_MOE_LEAF(router_aux_loss_coef),  MIXTRAIN_MOE_LEAF(norm_topk_prob),
  };
  register_config_section(std::move(spec));
}

#undef MIXTRAIN_MOE_LEAF

}  // namespace mixtrain
