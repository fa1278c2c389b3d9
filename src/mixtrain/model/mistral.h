// Mistral (Hugging Face MistralForCausalLM, model_type "mistral"): the dense decoder of qwen2.h
// without any bias (q/k/v/o and MLP), as Llama, with sliding-window causal attention:
// model.sliding_window (sliding_window_config.h; HF sliding_window, null = 0 = full causal)
// keys per query, itself included, in every layer. Parameter names, roles, tensor parallelism
// and numerics as qwen2.h. Context parallelism is refused with a window (validation names
// parallel.cp). Model keys it reads: intermediate_size, sliding_window (not attention_bias:
// Mistral's projections never have a bias).
#pragma once

#include <cstdint>
#include <memory>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/model/registry.h"

namespace mixtrain::mistral {

// A float32 model initialised from `seed` (init_hf_weights, layers.h).
std::shared_ptr<CausalLM> make_mistral(const ModelConfig& config, uint64_t seed);

// The registry's entry (registry.h).
ModelEntry mistral_entry();

}  // namespace mixtrain::mistral
