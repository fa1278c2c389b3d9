// The keys of a model with routed experts (qwen2_moe, qwen3_moe): the family's own part of
// ModelConfig (config/trainer_config.h `family`), registered as the config section "moe" (slot
// "model": after the keys every model has) by register_moe_config_section, which
// register_model_sections calls. Their checks and which model reads which key are the models'
// sections (qwen2_moe.cpp); a dense model refuses them when set.
#pragma once

#include <cstdint>

#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

struct MoeConfig {
  int64_t moe_intermediate_size = 64;             // each routed expert's SwiGLU width
  int64_t num_experts = 4;                        // routed experts per MoE layer
  int64_t num_experts_per_tok = 2;                // top-k
  int64_t shared_expert_intermediate_size = 128;  // the shared expert's width (qwen2_moe)
  double router_aux_loss_coef = 0.001;            // load-balancing loss coefficient
  bool norm_topk_prob = false;  // renormalise the top-k routing weights to sum to 1
};

// The MoE keys of `model` (its defaults when none was set).
inline MoeConfig& moe_config(ModelConfig& model) {
  return model.family.get<MoeConfig>();
}
inline const MoeConfig& moe_config(const ModelConfig& model) {
  return model.family.get<MoeConfig>();
}

// Registers the section with the leaves model.moe_intermediate_size, model.num_experts,
// model.num_experts_per_tok, model.shared_expert_intermediate_size, model.router_aux_loss_coef,
// model.norm_topk_prob (in that order).
void register_moe_config_section();

}  // namespace mixtrain
