// The keys of DeepSeek-V3 (model deepseek_v3: multi-head latent attention and the sigmoid-scored,
// group-limited, auxiliary-loss-free MoE): the family's own part of ModelConfig
// (config/trainer_config.h `family`), registered as the config section "deepseek_v3" (slot
// "model") by register_deepseek_v3_config_section, which register_model_sections calls. The
// routed-expert keys it shares with the other MoE models (moe_intermediate_size, num_experts,
// num_experts_per_tok, norm_topk_prob, router_aux_loss_coef) stay in moe_config.h. Names follow
// transformers' DeepseekV3Config; docs/config.md has each key.
#pragma once

#include <cstdint>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/core/param_role.h"

namespace mixtrain {

struct DeepseekV3Config {
  // MLA (docs/models.md, "deepseek_v3"): queries through a rank-q_lora_rank bottleneck with an
  // RMSNorm (0: one q_proj), keys and values from a rank-kv_lora_rank latent with an RMSNorm;
  // per head qk_nope_head_dim content dims plus qk_rope_head_dim rotary dims (the rotary key is
  // one for all heads), v_head_dim value dims.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 32;
  int64_t qk_nope_head_dim = 16;
  int64_t qk_rope_head_dim = 8;
  int64_t v_head_dim = 16;
  bool rope_interleave = true;  // rotary pairs (x0, x1), (x2, x3), ... (DeepSeek's layout)
  // MoE: n_shared_experts always-on experts of width n x moe_intermediate_size; experts in
  // n_group groups, each token picks topk_group groups, then its top k experts in them; the
  // chosen sigmoid scores (normalised with norm_topk_prob) times routed_scaling_factor.
  int64_t n_shared_experts = 1;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 1;  // layers [0, k) have a dense MLP of intermediate_size
  // Auxiliary-loss-free balancing (DeepSeek-V3 §2.1.2): after each optimizer step each MoE
  // layer's selection bias moves by bias_update_speed x sign(mean load - load) per expert.
  double bias_update_speed = 0.001;
};

// The per-head row layouts of the latent attention's projections (core/param_role.h): the
// query's dn content rows then dr rotary rows, kv_b_proj's dn key rows then dv value rows,
// o_proj's dv columns. The model declares them with its roles; optim-replay reads them from the
// config (hf_param_roles).
struct MlaHeadLayouts {
  HeadLayout query, key_value, output;
};
MlaHeadLayouts mla_head_layouts(const ModelConfig& model);

inline DeepseekV3Config& deepseek_v3_config(ModelConfig& model) {
  return model.family.get<DeepseekV3Config>();
}
inline const DeepseekV3Config& deepseek_v3_config(const ModelConfig& model) {
  return model.family.get<DeepseekV3Config>();
}

// Registers the section with the leaves model.q_lora_rank, model.kv_lora_rank,
// model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim, model.rope_interleave,
// model.n_shared_experts, model.n_group, model.topk_group, model.routed_scaling_factor,
// model.first_k_dense_replace, model.bias_update_speed (in that order). Their checks are the
// model's section's (deepseek_v3.cpp).
void register_deepseek_v3_config_section();

}  // namespace mixtrain
