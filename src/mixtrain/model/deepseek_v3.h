// DeepSeek-V3 (Hugging Face DeepseekV3ForCausalLM; Moonlight and Kimi K2 are this architecture),
// built natively on LibTorch: multi-head latent attention (MLA) and a MoE whose router scores
// experts with a sigmoid, limits each token to topk_group of n_group expert groups, and is
// balanced by a per-expert selection bias instead of an auxiliary loss (DeepSeek-V3 report,
// arXiv 2412.19437, §2.1). Checked against transformers 5.24's modeling_deepseek_v3.py.
//
// Parameter names and shapes are HF's (H hidden, n heads, dn = qk_nope_head_dim, dr =
// qk_rope_head_dim, dv = v_head_dim, rq = q_lora_rank, rkv = kv_lora_rank, E experts of I,
// shared width S = n_shared_experts x I, dense width F = intermediate_size):
//   model.embed_tokens.weight                                  [vocab, H]
//   model.layers.N.self_attn.q_proj.weight                      [n*(dn+dr), H]   (rq = 0)
//   model.layers.N.self_attn.q_a_proj.{weight,bias}             [rq, H], [rq]    (rq > 0)
//   model.layers.N.self_attn.q_a_layernorm.weight               [rq]
//   model.layers.N.self_attn.q_b_proj.weight                    [n*(dn+dr), rq]
//   model.layers.N.self_attn.kv_a_proj_with_mqa.{weight,bias}   [rkv+dr, H], [rkv+dr]
//   model.layers.N.self_attn.kv_a_layernorm.weight              [rkv]
//   model.layers.N.self_attn.kv_b_proj.weight                   [n*(dn+dv), rkv]
//   model.layers.N.self_attn.o_proj.{weight,bias}               [H, n*dv], [H]
//     (the biases with attention_bias)
//   N < first_k_dense_replace:
//   model.layers.N.mlp.{gate,up}_proj.weight [F, H], mlp.down_proj.weight [H, F]
//   N >= first_k_dense_replace:
//   model.layers.N.mlp.gate.weight                              [E, H]   (router)
//   model.layers.N.mlp.experts.{gate_proj,up_proj} [E, I, H], .down_proj [E, H, I]
//   model.layers.N.mlp.shared_experts.{gate,up}_proj.weight [S, H], .down_proj.weight [H, S]
//   model.layers.N.{input,post_attention}_layernorm.weight      [H]
//   model.norm.weight [H], lm_head.weight [vocab, H] (none when tied)
// Beside the parameters each MoE layer holds its selection bias,
// model.layers.N.mlp.gate.e_score_correction_bias float32 [E] (HF's buffer of that name):
// model state, not a parameter (CausalLM::balancing_bias; no optimizer sees it).
//
// Attention, per head h (HF DeepseekV3Attention, eval, no cache):
//   q = q_proj(x) or q_b_proj(rmsnorm(q_a_proj(x))), split per head into q_nope [dn], q_pe [dr];
//   [c_kv, k_pe] = kv_a_proj_with_mqa(x); c_kv = rmsnorm(c_kv) [rkv]; k_pe [dr] is one rotary
//   key shared by every head; kv_b_proj(c_kv) split per head into k_nope [dn], v [dv];
//   q_pe, k_pe rotated (rotary over dr dims; interleaved pairs with rope_interleave);
//   attention of [q_nope, q_pe] against [k_nope, k_pe] scaled by (dn + dr)^-1/2, values v;
//   o_proj of the heads' outputs.
// The rotary tables are the model's usual ones (layers.h) over model.head_dim dims, which this
// model requires to equal qk_rope_head_dim (HF sets head_dim so); num_kv_heads must equal
// num_heads (every head has its own keys and values). The attention kernels (attention.h, and
// context parallelism's ring) take one head dim: q, k, v are zero-padded to it and the scale is
// folded into q. Tensor parallelism splits the heads (q_proj / q_b_proj, kv_b_proj by head,
// o_proj's columns); the down projections, their norms, the router and the routed experts stay
// whole on every tp rank, the shared experts and dense MLPs split as SwiGLU MLPs.
// Router (HF DeepseekV3TopkRouter), in float32: s = sigmoid(x W^T) [T, E]; selection scores
// s + bias; a group's score is the sum of its two best selection scores; the topk_group best
// groups are kept, the other groups' experts masked; the top k experts by selection score are
// chosen; their weights are s (without the bias), divided by their sum + 1e-20 with
// norm_topk_prob, times routed_scaling_factor, cast to the compute dtype. The MoE output is the
// routed experts' weighted sum (moe_experts.h) plus the shared experts' SwiGLU MLP.
// aux_loss: DeepSeek-V3's sequence-wise balance loss (report eq. 17-20), summed over the MoE
// layers and averaged over the batch's sequences: per sequence of T tokens,
//   s'_t = s_t / sum_e s_t,e,  f_e = E / (k T) |{t : e chosen for t}|,  P_e = mean_t s'_t,e,
//   loss = sum_e f_e P_e  (1 for perfectly balanced routing);
// the trainer multiplies it by router_aux_loss_coef (0 switches it off; HF computes none).
// Numerics follow HF as qwen2_moe.h describes (RMSNorm in float32, eager attention's softmax in
// float32 or LibTorch's flash kernel in float32). The routed experts use moe_experts.h with the
// weights in the compute dtype (HF multiplies the bf16 expert output by the float32 weight and
// rounds the product: a bf16 run may differ from HF's by an ulp there).
// Roles (core/param_role.h): q_proj, q_b_proj kAttentionQuery; q_a_proj, kv_a_proj_with_mqa
// kAttentionLatent; kv_b_proj kAttentionKeyValue; o_proj kAttentionOutput; the two latent norms
// kNorm; dense MLP and shared experts kMlp; gate kRouter; experts kExpert.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/model/registry.h"

namespace mixtrain::deepseek_v3 {

// A float32 model initialised from `seed` (init_hf_weights: normal(0, 0.02), norms 1, biases
// 0; selection biases 0). Throws std::invalid_argument naming the field when the shapes cannot
// work.
std::shared_ptr<CausalLM> make_deepseek_v3(const ModelConfig& config, uint64_t seed);

ModelEntry deepseek_v3_entry();

struct Routing {
  torch::Tensor scores;   // float32 [T, E]: sigmoid(router logits)
  torch::Tensor weights;  // float32 [T, k]: the chosen experts' weights (as above)
  torch::Tensor indices;  // int64 [T, k]: the chosen experts, best selection score first
};

// The router above after its linear: router_logits float32 [T, E], bias float32 [E].
Routing route_grouped_sigmoid(const torch::Tensor& router_logits, const torch::Tensor& bias,
                              int64_t top_k, int64_t n_group, int64_t topk_group,
                              bool norm_topk_prob, double routed_scaling_factor);

// The sequence-wise balance loss above of one MoE layer: scores float32 [B * S, E], indices
// int64 [B * S, k], `batch` sequences of equal length -> float32 scalar, the mean over the
// sequences. With context parallelism each sequence's sums run over the cp group's tokens.
torch::Tensor sequence_balance_loss(const torch::Tensor& scores, const torch::Tensor& indices,
                                    int64_t batch, ContextParallelHooks* cp = nullptr);

}  // namespace mixtrain::deepseek_v3
