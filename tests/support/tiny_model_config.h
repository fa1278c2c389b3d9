// The tiny Qwen2-MoE the model and parallel-layout tests share: every dimension differs from
// the others (vocab 37, hidden 24, 4 heads x 8 with 2 kv heads, expert width 12, shared expert
// width 20), so a swapped dimension cannot go unnoticed, and it is small enough for multi-rank
// tests on two cores.
#pragma once

#include "mixtrain/config/trainer_config.h"
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

}  // namespace mixtrain::test_support
