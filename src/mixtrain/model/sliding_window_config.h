// The key of models with sliding-window attention (mistral): the family's own part of
// ModelConfig (config/trainer_config.h `family`), registered as the config section
// "sliding_window" (slot "model") by register_sliding_window_section, which
// register_model_sections calls. model.sliding_window: each position attends to the last N keys,
// itself included (HF MistralConfig.sliding_window; null there is 0 here: every earlier key).
// The section refuses parallel.cp > 1 with a window (the ring attention has none).
#pragma once

#include <cstdint>

#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

struct SlidingWindowConfig {
  int64_t sliding_window = 0;  // 0: full causal attention
};

inline SlidingWindowConfig& sliding_window_config(ModelConfig& model) {
  return model.family.get<SlidingWindowConfig>();
}
inline const SlidingWindowConfig& sliding_window_config(const ModelConfig& model) {
  return model.family.get<SlidingWindowConfig>();
}

void register_sliding_window_section();

}  // namespace mixtrain
