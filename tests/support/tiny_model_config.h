// The tiny Qwen2-MoE the model and parallel-layout tests share: every dimension differs from
// the others (vocab 37, hidden 24, 4 heads x 8 with 2 kv heads, expert width 12, shared expert
// width 20), so a swapped dimension cannot go unnoticed, and it is small enough for multi-rank
// tests on two cores.
#pragma once

#include <string>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/model/deepseek_v3_config.h"
#include "mixtrain/model/moe_config.h"

namespace mixtrain::test_support {

inline ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 37;
  c.hidden_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  moe_config(c).moe_intermediate_size = 12;
  moe_config(c).num_experts = 4;
  moe_config(c).num_experts_per_tok = 2;
  moe_config(c).shared_expert_intermediate_size = 20;
  c.max_seq_len = 16;
  moe_config(c).router_aux_loss_coef = 0.01;
  return c;
}

// A tiny DeepSeek-V3 (model deepseek_v3) with every MLA and router dimension distinct and odd
// where HF allows (3 heads of 10 content + 6 rotary query/key dims and 7 value dims, latent ranks
// 11 and 9), 3 layers of which the first is dense (width 19), 8 experts of 5 in 4 groups of 2,
// each token keeping 2 groups and 3 experts, 2 shared experts, routed scaling 2.5.
// q_lora_rank 0: one q_proj, no query compression.
inline ModelConfig tiny_deepseek_v3(int64_t q_lora_rank = 9) {
  ModelConfig c;
  c.name = "deepseek_v3";
  c.vocab_size = 37;
  c.hidden_size = 24;
  c.num_layers = 3;
  c.num_heads = 3;
  c.num_kv_heads = 3;
  c.head_dim = 6;
  c.intermediate_size = 19;
  c.max_seq_len = 16;
  c.attention_bias = false;
  auto& moe = moe_config(c);
  moe.moe_intermediate_size = 5;
  moe.num_experts = 8;
  moe.num_experts_per_tok = 3;
  moe.norm_topk_prob = true;
  moe.router_aux_loss_coef = 0.0;
  auto& d = deepseek_v3_config(c);
  d.q_lora_rank = q_lora_rank;
  d.kv_lora_rank = 11;
  d.qk_nope_head_dim = 10;
  d.qk_rope_head_dim = 6;
  d.v_head_dim = 7;
  d.n_shared_experts = 2;
  d.n_group = 4;
  d.topk_group = 2;
  d.routed_scaling_factor = 2.5;
  d.first_k_dense_replace = 1;
  return c;
}

// A tiny config of registered model `name`: tiny_deepseek_v3() for deepseek_v3 (its attention
// has other shape rules), else tiny_config() renamed.
inline ModelConfig tiny_config_of(const std::string& name) {
  if (name == "deepseek_v3") return tiny_deepseek_v3();
  ModelConfig c = tiny_config();
  c.name = name;
  return c;
}

}  // namespace mixtrain::test_support
