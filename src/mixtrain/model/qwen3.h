// Qwen3 dense (Hugging Face Qwen3ForCausalLM, model_type "qwen3"): the dense decoder of qwen2.h
// with per-head RMSNorm on queries and keys (self_attn.q_norm / k_norm, weight [head_dim],
// applied before rotary, as Qwen3-MoE's) and q/k/v/o biases only with attention_bias (HF's
// default false). The MLP is SwiGLU without biases; no sliding window (HF use_sliding_window
// false, every layer_types entry full_attention); embeddings untied or tied
// (model.tie_word_embeddings, as Qwen3-0.6B/1.7B/4B). Parameter roles, tensor parallelism and
// numerics as qwen2.h (the q/k norms are kNorm, whole on every tp rank). Its per-head q/k norms
// make QK-clip meaningless (ModelSection::qk_norm). Model keys it reads: those of qwen2.h.
#pragma once

#include <cstdint>
#include <memory>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/model/registry.h"

namespace mixtrain::qwen3 {

// A float32 model initialised from `seed` (init_hf_weights, layers.h).
std::shared_ptr<CausalLM> make_qwen3(const ModelConfig& config, uint64_t seed);

// The registry's entry (registry.h).
ModelEntry qwen3_entry();

}  // namespace mixtrain::qwen3
