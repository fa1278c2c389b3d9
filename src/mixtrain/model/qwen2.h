// The dense decoders, built natively on LibTorch from the shared Qwen2-family blocks (layers.h):
// Qwen2 (Hugging Face Qwen2ForCausalLM) and Llama (LlamaForCausalLM), one decoder whose only
// difference is the attention's biases: Qwen2 has q/k/v biases and none on o_proj, always (it
// refuses attention_bias = false); Llama has biases on q/k/v and o_proj iff attention_bias
// (HF's default is false; ours, shared by all models, is true: set it, or take it from
// hf_config). Llama's mlp_bias (HF default false) is not offered.
// Parameter names and shapes are HF's (I = intermediate_size, H = hidden_size, D = head_dim):
//   model.embed_tokens.weight                                 [vocab, H]
//   model.layers.N.self_attn.{q,k,v}_proj.{weight[,bias]}, o_proj.{weight[,bias]} (as
//   qwen2_moe.h)
//   model.layers.N.mlp.{gate,up}_proj.weight                  [I, H]
//   model.layers.N.mlp.down_proj.weight                       [H, I]
//   model.layers.N.{input,post_attention}_layernorm.weight    [H]
//   model.norm.weight [H], lm_head.weight [vocab, H] (none with model.tie_word_embeddings: the
//   head is then model.embed_tokens, as in Qwen2.5-0.5B/1.5B/3B; layers.h)
// No sliding window (HF use_sliding_window = false, the default), no dropout. Numerics as
// qwen2_moe.h: RMSNorm in float32 and cast back, rotary tables in float32, attention softmax in
// float32; the MLP is SwiGLU. No router: aux_loss = 0. Parameter roles (core/param_role.h):
// embed_tokens kEmbedding, self_attn.{q,k,v,o}_proj kAttention{Query,Key,Value,Output}, mlp kMlp,
// norms kNorm, lm_head kOutputHead; no kExpert, so expert parallelism does not apply. Tensor
// parallelism (Megatron): embed_tokens and lm_head split over the vocabulary, q/k/v and
// mlp.{gate,up}_proj column-, o_proj and mlp.down_proj row-parallel, norms whole.
// Model keys they read: vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, head_dim,
// intermediate_size, max_seq_len, rope_theta, rms_norm_eps, attention_bias, tie_word_embeddings
// (docs/config.md).
#pragma once

#include <cstdint>
#include <memory>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/model/layers.h"
#include "mixtrain/model/registry.h"

namespace mixtrain::qwen2 {

// Builds a float32 model initialised from `seed` (init_hf_weights, layers.h). Throws
// std::invalid_argument naming the field when the shapes cannot work.
std::shared_ptr<CausalLM> make_qwen2(const ModelConfig& config, uint64_t seed);
std::shared_ptr<CausalLM> make_llama(const ModelConfig& config, uint64_t seed);

// The dense decoder these families share, for a variant with its own attention (qwen3.h).
// `label` (a string literal) names the model in errors.
std::shared_ptr<CausalLM> make_dense_decoder(const ModelConfig& config, uint64_t seed,
                                             const char* label, const AttentionOptions& attention);

// A dense model's config section: its own keys intermediate_size and attention_bias, no routed
// experts, the MLP width split by tensor parallelism.
ModelSection dense_section(const std::string& name);

// The registry's entries (registry.h).
ModelEntry qwen2_entry();
ModelEntry llama_entry();

}  // namespace mixtrain::qwen2
