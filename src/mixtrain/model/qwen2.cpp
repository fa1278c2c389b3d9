#include "mixtrain/model/qwen2.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "mixtrain/model/layers.h"
#include "mixtrain/model/recompute.h"

namespace mixtrain::qwen2 {
namespace {

class Qwen2DecoderLayer : public torch::nn::Module {
 public:
  Qwen2DecoderLayer(const ModelConfig& c, const ParamAccess& access,
                    const AttentionOptions& attention) {
    // Registration order = HF's, so named_parameters() lists in state_dict order.
    self_attn = register_module(
        "self_attn", std::make_shared<Qwen2Attention>(c, access.child("self_attn"), attention));
    mlp = register_module("mlp", std::make_shared<SwiGLUMLP>(c.hidden_size, c.intermediate_size,
                                                             access.child("mlp")));
    input_layernorm = register_module(
        "input_layernorm",
        std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, access.child("input_layernorm")));
    post_attention_layernorm =
        register_module("post_attention_layernorm",
                        std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps,
                                                  access.child("post_attention_layernorm")));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
    auto h = x + self_attn->forward(input_layernorm->forward(x), cos, sin);
    return h + mlp->forward(post_attention_layernorm->forward(h));
  }

  std::shared_ptr<Qwen2Attention> self_attn;
  std::shared_ptr<SwiGLUMLP> mlp;
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
};

class Qwen2Model : public torch::nn::Module {
 public:
  Qwen2Model(const ModelConfig& c, const ParamAccess& access, const AttentionOptions& attention)
      : config_(c), access_(access) {
    embed_tokens = register_module(
        "embed_tokens",
        std::make_shared<Embedding>(c.vocab_size, c.hidden_size, access.child("embed_tokens")));
    auto list = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_layers; ++i) {
      layers.push_back(std::make_shared<Qwen2DecoderLayer>(
          c, access.child("layers." + std::to_string(i)), attention));
      list->push_back(layers.back());
    }
    norm = register_module(
        "norm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, access.child("norm")));
  }

  // input_ids [B, S] -> final hidden states [B, S, H]; the layers recomputes_layer(i,
  // recompute_every) picks are recomputed in backward (recompute.h).
  torch::Tensor forward(const torch::Tensor& input_ids, int64_t recompute_every) {
    auto [cos, sin] = rotary_(input_ids, config_, access_);
    auto h = embed_tokens->forward(input_ids);
    for (size_t i = 0; i < layers.size(); ++i) {
      Qwen2DecoderLayer& layer = *layers[i];
      if (!recomputes_layer(static_cast<int64_t>(i), recompute_every)) {
        h = layer.forward(h, cos, sin);
        continue;
      }
      h = recompute_in_backward(
          [&layer, cos = cos, sin = sin](const std::vector<torch::Tensor>& in) {
            return std::vector<torch::Tensor>{layer.forward(in[0], cos, sin)};
          },
          {h})[0];
    }
    return norm->forward(h);
  }

  std::shared_ptr<Embedding> embed_tokens;
  std::vector<std::shared_ptr<Qwen2DecoderLayer>> layers;  // registered as "layers.N"
  std::shared_ptr<RMSNorm> norm;

 private:
  ModelConfig config_;
  RotaryTables rotary_;  // per sequence length and device
  ParamAccess access_;
};

class Qwen2ForCausalLM : public Qwen2FamilyForCausalLM<Qwen2Model> {
 public:
  // label: "qwen2" or "llama"; they differ only in the attention's biases.
  Qwen2ForCausalLM(const ModelConfig& c, uint64_t seed, const char* label,
                   const AttentionOptions& attention)
      : Qwen2FamilyForCausalLM(c, label, attention) {
    assign_common_roles();
    assign_common_tp_dims();
    for (size_t i = 0; i < model->layers.size(); ++i) {
      assign_param_role(layer_prefix(i) + "mlp.", *model->layers[i]->mlp, ParamRole::kMlp);
      assign_mlp_tp_dims(layer_prefix(i) + "mlp.", *model->layers[i]->mlp);
    }
    init_hf_weights(*this, seed);
  }

  CausalLMOutput forward(const torch::Tensor& input_ids) override {
    CausalLMOutput out;
    out.logits = logits(model->forward(model_input(input_ids), activation_checkpointing()));
    out.aux_loss = torch::zeros({}, out.logits.options().dtype(torch::kFloat32));  // no router
    return out;
  }
};

void validate_dense(const ModelConfig& config) {
  validate_qwen2_common(config);
  require_model_key(config.intermediate_size > 0, "intermediate_size", "must be > 0");
}

}  // namespace

std::shared_ptr<CausalLM> make_dense_decoder(const ModelConfig& config, uint64_t seed,
                                             const char* label, const AttentionOptions& attention) {
  validate_dense(config);
  return std::make_shared<Qwen2ForCausalLM>(config, seed, label, attention);
}

namespace {

void check_dense(const ModelConfig& m, const ConfigChecker& check) {
  check.positive("model.intermediate_size", m.intermediate_size);
}

void check_qwen2(const ModelConfig& m, const ConfigChecker& check) {
  check_dense(m, check);
  // HF Qwen2Attention has q/k/v biases unconditionally: a bias-free Qwen2 would not be Qwen2.
  if (!m.attention_bias) {
    check.fail_value("model.attention_bias",
                     "must be true for model qwen2 (its q/k/v projections always have biases); "
                     "model llama has bias-free attention");
  }
}

}  // namespace

ModelSection dense_section(const std::string& name) {
  ModelSection section;
  section.name = name;
  section.own_keys = {"model.intermediate_size", "model.attention_bias"};
  section.check = check_dense;
  section.routed_experts = [](const ModelConfig&) -> int64_t { return 0; };
  // Column-parallel MLP widths.
  section.tp_split_sizes = [](const ModelConfig& m) {
    return std::vector<std::pair<std::string, int64_t>>{
        {"model.intermediate_size", m.intermediate_size}};
  };
  return section;
}

ModelEntry qwen2_entry() {
  ModelSection section = dense_section("qwen2");
  section.check = check_qwen2;
  HfFamily hf;
  hf.architecture = "Qwen2ForCausalLM";
  hf.attention_bias_default = true;  // no field: q/k/v always carry a bias
  return {"qwen2", make_qwen2, section, hf};
}

ModelEntry llama_entry() {
  HfFamily hf;
  hf.architecture = "LlamaForCausalLM";
  hf.attention_bias_field = "attention_bias";
  hf.writes_sliding_window = false;
  hf.writes_mlp_bias = true;
  return {"llama", make_llama, dense_section("llama"), hf};
}

std::shared_ptr<CausalLM> make_qwen2(const ModelConfig& config, uint64_t seed) {
  validate_dense(config);
  require_model_key(config.attention_bias, "attention_bias",
                    "must be true for qwen2 (HF Qwen2 always has q/k/v biases); use llama for "
                    "bias-free attention");
  return std::make_shared<Qwen2ForCausalLM>(config, seed, "qwen2",
                                            AttentionOptions{/*qkv_bias=*/true, /*o_bias=*/false});
}

std::shared_ptr<CausalLM> make_llama(const ModelConfig& config, uint64_t seed) {
  validate_dense(config);
  const bool bias = config.attention_bias;
  return std::make_shared<Qwen2ForCausalLM>(config, seed, "llama",
                                            AttentionOptions{/*qkv_bias=*/bias, /*o_bias=*/bias});
}

}  // namespace mixtrain::qwen2
