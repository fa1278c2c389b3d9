// The MoE decoders, built natively on LibTorch: Qwen2-MoE (Hugging Face Qwen2MoeForCausalLM)
// and Qwen3-MoE (Qwen3MoeForCausalLM), one decoder with options. Qwen3-MoE differs in three
// places: each attention head's q and k are RMS-normalised over head_dim before rotary
// (self_attn.{q,k}_norm.weight [D], role kNorm); there is no shared expert (nor its gate); and
// attention_bias biases q/k/v and o_proj alike (Qwen2-MoE: q/k/v only, HF qkv_bias). Router and
// aux loss are the same in both (checked against transformers 5.24's modeling_qwen{2,3}_moe.py:
// same TopKRouter, same load_balancing_loss_func). Qwen3-MoE layers are all sparse: HF's
// decoder_sparse_step = 1 and mlp_only_layers = [] (its dense-MLP layers are not offered).
//
// Parameter names and shapes are HF's, so checkpoints map 1:1 (E = num_experts,
// I = moe_intermediate_size, S = shared_expert_intermediate_size, H = hidden_size, D = head_dim):
//   model.embed_tokens.weight                              [vocab, H]
//   model.layers.N.self_attn.q_proj.{weight,bias}           [num_heads*D, H], [num_heads*D]
//   model.layers.N.self_attn.{k,v}_proj.{weight,bias}       [num_kv_heads*D, H], [num_kv_heads*D]
//   model.layers.N.self_attn.o_proj.{weight,bias}           [H, num_heads*D], [H]
//   model.layers.N.self_attn.{q,k}_norm.weight              [D]   (qwen3_moe)
//     (biases per attention_bias: q/k/v for qwen2_moe, q/k/v/o for qwen3_moe)
//   model.layers.N.mlp.gate.weight                          [E, H]            (router)
//   model.layers.N.mlp.experts.{gate_proj,up_proj}          [E, I, H]
//   model.layers.N.mlp.experts.down_proj                    [E, H, I]
//   model.layers.N.mlp.shared_expert.{gate,up}_proj.weight  [S, H]   (qwen2_moe)
//   model.layers.N.mlp.shared_expert.down_proj.weight       [H, S]   (qwen2_moe)
//   model.layers.N.mlp.shared_expert_gate.weight            [1, H]   (qwen2_moe)
//   model.layers.N.{input,post_attention}_layernorm.weight  [H]
//   model.norm.weight [H], lm_head.weight [vocab, H] (none when tied)
// The experts are stored as 3-D tensors (the layout of current HF and of expert parallelism);
// the model has no buffers: rotary cos/sin are computed per forward in float32 (HF keeps inv_freq
// as a non-persistent buffer, which LibTorch cannot mark as such, and which would be rounded to
// bf16 by model_init_dtype).
//
// Numerics follow HF: RMSNorm in float32 and cast back; attention softmax in float32 (in bf16 and
// fp16 HF's eager attention, in float32 LibTorch's flash kernel: attention.h); router softmax in
// float32, top-k, then (norm_topk_prob) divided by their sum in float32, routing weights cast to
// the compute dtype; SwiGLU experts; shared expert scaled by sigmoid(shared_expert_gate(x)).
// Every parameter is read through the CausalLM materializer (causal_lm.h) under its HF name, and
// each module (linear, embedding, norm, the routed experts as one unit) reports its output to
// post_forward, so FSDP can gather, reshard and gather again per module; without a materializer
// the model computes exactly as it always did.
// Parameter roles (core/param_role.h): embed_tokens kEmbedding, self_attn.{q,k,v,o}_proj
// kAttention{Query,Key,Value,Output} (q/k_norm kNorm), mlp.gate and
// mlp.shared_expert_gate kRouter, mlp.experts kExpert, mlp.shared_expert kMlp, norms kNorm,
// lm_head kOutputHead. Tensor parallelism (CausalLM::tp_dim, layers.h TpStyle): embed_tokens
// and lm_head split over the vocabulary, q/k/v and shared_expert.{gate,up}_proj column-,
// o_proj and shared_expert.down_proj row-parallel; the router, shared_expert_gate, the routed
// experts and the norms are whole on every tp rank, and each tp rank runs all of its routed
// experts on the same tokens (redundant work: expert-tensor-parallelism is not offered; expert
// parallelism splits them). The shared building blocks (attention, RMSNorm, rotary, SwiGLU) are in
// layers.h.
// Compute dtype = parameter dtype: float32, bfloat16 and float16 (LibTorch 2.x has CPU float16
// GEMM) all run on CPU.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/model/layers.h"
#include "mixtrain/model/registry.h"

namespace mixtrain::qwen2_moe {

// Builds a float32 model initialised from `seed` with a local CPU generator, HF style:
// normal(0, 0.02) for linear, embedding and expert weights, zero biases, ones for norms.
// Throws std::invalid_argument naming the field when the shapes cannot work (e.g. num_heads not a
// multiple of num_kv_heads, num_experts_per_tok > num_experts, odd head_dim).
std::shared_ptr<CausalLM> make_qwen2_moe(const ModelConfig& config, uint64_t seed);
std::shared_ptr<CausalLM> make_qwen3_moe(const ModelConfig& config, uint64_t seed);

// The registry's entries (registry.h).
ModelEntry qwen2_moe_entry();
ModelEntry qwen3_moe_entry();

// HF TopKRouter after its linear: p = softmax(router_logits) in float32, (weights, indices) =
// top_k(p), then with norm_topk_prob weights / sum(weights). Returns float32 weights [T, k] and
// int64 indices [T, k] (descending probability, as torch.topk).
std::pair<torch::Tensor, torch::Tensor> route_top_k(const torch::Tensor& router_logits,
                                                    int64_t top_k, bool norm_topk_prob);

// HF load_balancing_loss_func (Switch Transformer eq. 4-6) over all layers' router logits
// (each [tokens, E]; concatenated along tokens, so every layer's tokens count alike):
//   p = softmax(logits) in float32, T = total tokens over all layers,
//   f_e = |{t : e in top_k(p_t)}| / T   (fraction of tokens routed to e; sums to top_k),
//   P_e = (1/T) sum_t p_t,e              (mean router probability of e),
//   loss = E * sum_e f_e * P_e.
// Gradient flows through P only (top-k is not differentiable). Returns a float32 scalar; 0 for an
// empty list. Balanced routing gives top_k; all tokens on the same experts give up to E.
// Qwen3-MoE's loss is the same function (transformers 5.24); it does not see norm_topk_prob.
// With context parallelism (cp), T and both sums run over the cp group's tokens, so every cp
// rank gets the whole sequence's loss.
torch::Tensor load_balancing_loss(const std::vector<torch::Tensor>& router_logits,
                                  int64_t num_experts, int64_t top_k,
                                  ContextParallelHooks* cp = nullptr);

// The rotary helpers live in layers.h (shared with qwen2); these names stay for callers.
using mixtrain::apply_rotary_pos_emb;
using mixtrain::rotary_cos_sin;

}  // namespace mixtrain::qwen2_moe
