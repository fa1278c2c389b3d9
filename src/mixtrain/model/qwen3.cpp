#include "mixtrain/model/qwen3.h"

#include "mixtrain/model/layers.h"
#include "mixtrain/model/qwen2.h"

namespace mixtrain::qwen3 {

std::shared_ptr<CausalLM> make_qwen3(const ModelConfig& config, uint64_t seed) {
  const bool bias = config.attention_bias;
  return qwen2::make_dense_decoder(
      config, seed, "qwen3",
      AttentionOptions{/*qkv_bias=*/bias, /*o_bias=*/bias, /*qk_norm=*/true});
}

ModelEntry qwen3_entry() {
  ModelSection section = qwen2::dense_section("qwen3");
  section.qk_norm = true;
  HfFamily hf;
  hf.architecture = "Qwen3ForCausalLM";
  hf.attention_bias_field = "attention_bias";
  return {"qwen3", make_qwen3, section, hf};
}

}  // namespace mixtrain::qwen3
