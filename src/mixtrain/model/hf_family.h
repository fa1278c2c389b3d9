// What a model family's Hugging Face config.json looks like beyond the fields every decoder here
// shares (hf_config.h reads and writes those): its class name, whether it has routed experts,
// where its attention bias and expert count live, the fields only it writes. One per model in
// model/registry.cpp.
#pragma once

#include <string>

namespace mixtrain {

struct HfFamily {
  std::string architecture;    // transformers' class: "Qwen2ForCausalLM"
  bool moe = false;            // routed experts in every layer (no dense layers)
  bool shared_expert = false;  // shared_expert_intermediate_size
  // model.attention_bias: the field it is read from and written to ("" = none: the family
  // always has attention_bias_default), and its value when the field is absent.
  std::string attention_bias_field;
  bool attention_bias_default = false;
  // The expert count: read from experts_field, else from experts_field_older (transformers
  // 4.x's spelling; where both are present they must agree); written as experts_field.
  std::string experts_field = "num_experts";
  std::string experts_field_older;
  bool writes_sliding_window = true;  // "use_sliding_window": false
  // model.sliding_window (sliding_window_config.h) is read from and written to this field (null
  // there: 0); "" = the family has no window (its sliding_window field, if any, is unused).
  std::string sliding_window_field;
  bool writes_mlp_bias = false;  // "mlp_bias": false
};

}  // namespace mixtrain
