#include "mixtrain/model/mistral.h"

#include "mixtrain/model/layers.h"
#include "mixtrain/model/qwen2.h"
#include "mixtrain/model/sliding_window_config.h"

namespace mixtrain::mistral {

std::shared_ptr<CausalLM> make_mistral(const ModelConfig& config, uint64_t seed) {
  const int64_t window = sliding_window_config(config).sliding_window;
  require_model_key(window >= 0, "sliding_window", "must be >= 0");
  AttentionOptions attention{/*qkv_bias=*/false, /*o_bias=*/false};
  attention.sliding_window = window;
  return qwen2::make_dense_decoder(config, seed, "mistral", attention);
}

ModelEntry mistral_entry() {
  // No model.attention_bias: Mistral's projections never have a bias.
  ModelSection section = qwen2::dense_section("mistral");
  section.own_keys = {"model.intermediate_size", "model.sliding_window"};
  HfFamily hf;
  hf.architecture = "MistralForCausalLM";
  hf.attention_bias_default = false;  // no field: never a bias
  hf.writes_sliding_window = false;   // no use_sliding_window: the window itself says it
  hf.sliding_window_field = "sliding_window";
  return {"mistral", make_mistral, section, hf};
}

}  // namespace mixtrain::mistral
