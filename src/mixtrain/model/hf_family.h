// What a model family's Hugging Face config.json looks like beyond the fields every decoder here
// shares (hf_config.h reads and writes those): its class name, whether it has routed experts,
// where its attention bias and expert count live, the fields only it writes. One per model in
// model/registry.cpp.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <string>
#include <vector>

#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

class HfConfigReader;  // hf_config.h

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
  // Tensors transformers keeps in float32 whatever the model's dtype (its
  // _keep_in_fp32_modules_strict), by name suffix: export-hf writes them in float32.
  std::vector<std::string> float32_suffixes;
  // model.head_dim when config.json has no head_dim: this field's value ("" = hidden_size /
  // num_attention_heads, transformers' default).
  std::string head_dim_default_field;
  // The family's own fields beyond the shared ones (deepseek_v3's attention and router), read
  // after them: each key set is reported with add(key, field, architecture) as read_hf_config
  // does; and written into an export's config.json after them (may overwrite a shared field).
  using AddField =
      std::function<void(const std::string& key, const std::string& hf_field, bool architecture)>;
  std::function<void(const HfConfigReader&, ModelConfig&, const AddField&)> read_own;
  std::function<void(const ModelConfig&, nlohmann::json&)> write_own;
};

}  // namespace mixtrain
