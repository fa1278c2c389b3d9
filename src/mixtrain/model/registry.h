// Model registry: builds the model that ModelConfig::name selects.
//
// Known names: "qwen2_moe". The model is built in float32 on the CPU and initialised
// deterministically from `seed` (same config and seed: bit-identical parameters on every
// machine and run; the global RNG is neither read nor advanced). model_init_dtype is applied
// afterwards by the caller (init_dtype.h). An unknown name, or a structurally impossible
// config, throws ConfigError naming the model.* key.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/model/causal_lm.h"

namespace mixtrain {

std::shared_ptr<CausalLM> build_model(const ModelConfig& config, uint64_t seed);

// The names build_model accepts, for help texts and error messages.
std::vector<std::string> registered_model_names();

}  // namespace mixtrain
