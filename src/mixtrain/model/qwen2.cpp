#include "mixtrain/model/qwen2.h"

#include <torch/torch.h>

#include <string>
#include <vector>

#include "mixtrain/model/layers.h"

namespace mixtrain::qwen2 {
namespace {

class Qwen2DecoderLayer : public torch::nn::Module {
 public:
  Qwen2DecoderLayer(const ModelConfig& c, const ParamAccess& access) {
    // Registration order = HF's, so named_parameters() lists in state_dict order.
    self_attn = register_module("self_attn",
                                std::make_shared<Qwen2Attention>(c, access.child("self_attn")));
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
  Qwen2Model(const ModelConfig& c, const ParamAccess& access) : config_(c) {
    embed_tokens = register_module(
        "embed_tokens",
        std::make_shared<Embedding>(c.vocab_size, c.hidden_size, access.child("embed_tokens")));
    auto list = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_layers; ++i) {
      layers.push_back(
          std::make_shared<Qwen2DecoderLayer>(c, access.child("layers." + std::to_string(i))));
      list->push_back(layers.back());
    }
    norm = register_module(
        "norm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, access.child("norm")));
  }

  // input_ids [B, S] -> final hidden states [B, S, H]
  torch::Tensor forward(const torch::Tensor& input_ids) {
    auto [cos, sin] = rotary_cos_sin(input_ids.size(1), config_.head_dim, config_.rope_theta);
    auto h = embed_tokens->forward(input_ids);
    for (auto& layer : layers) h = layer->forward(h, cos, sin);
    return norm->forward(h);
  }

  std::shared_ptr<Embedding> embed_tokens;
  std::vector<std::shared_ptr<Qwen2DecoderLayer>> layers;  // registered as "layers.N"
  std::shared_ptr<RMSNorm> norm;

 private:
  ModelConfig config_;
};

class Qwen2ForCausalLM : public CausalLM {
 public:
  Qwen2ForCausalLM(const ModelConfig& c, uint64_t seed) : config_(c) {
    const ParamAccess root{materializer_slot(), ""};
    model = register_module("model", std::make_shared<Qwen2Model>(c, root.child("model")));
    lm_head = register_module("lm_head", std::make_shared<Linear>(c.hidden_size, c.vocab_size,
                                                                  false, root.child("lm_head")));
    assign_roles();
    init_hf_weights(*this, seed);
  }

  CausalLMOutput forward(const torch::Tensor& input_ids) override {
    TORCH_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == torch::kInt64,
                "qwen2: input_ids must be int64 [batch, seq], got ", input_ids.scalar_type(), " ",
                input_ids.sizes());
    TORCH_CHECK(input_ids.size(1) <= config_.max_seq_len, "qwen2: sequence length ",
                input_ids.size(1), " exceeds max_seq_len ", config_.max_seq_len);
    const auto& materializer = parameter_materializer();
    const auto hidden =
        model->forward(materializer ? materializer->cast_forward_input(input_ids) : input_ids);
    CausalLMOutput out;
    out.logits = lm_head->forward(hidden);
    if (materializer) out.logits = materializer->cast_forward_output(out.logits);
    out.aux_loss = torch::zeros({}, torch::kFloat32);  // no router
    return out;
  }

  const ModelConfig& config() const override { return config_; }

  std::shared_ptr<Qwen2Model> model;
  std::shared_ptr<Linear> lm_head;

 private:
  void assign_roles() {
    assign_param_role("model.embed_tokens.", *model->embed_tokens, ParamRole::kEmbedding);
    for (size_t i = 0; i < model->layers.size(); ++i) {
      const auto& layer = *model->layers[i];
      const std::string p = "model.layers." + std::to_string(i) + ".";
      assign_param_role(p + "self_attn.", *layer.self_attn, ParamRole::kAttention);
      assign_param_role(p + "mlp.", *layer.mlp, ParamRole::kMlp);
      assign_param_role(p + "input_layernorm.", *layer.input_layernorm, ParamRole::kNorm);
      assign_param_role(p + "post_attention_layernorm.", *layer.post_attention_layernorm,
                        ParamRole::kNorm);
    }
    assign_param_role("model.norm.", *model->norm, ParamRole::kNorm);
    assign_param_role("lm_head.", *lm_head, ParamRole::kOutputHead);
  }

  ModelConfig config_;
};

}  // namespace

std::shared_ptr<CausalLM> make_qwen2(const ModelConfig& config, uint64_t seed) {
  validate_qwen2_common(config);
  require_model_key(config.intermediate_size > 0, "intermediate_size", "must be > 0");
  return std::make_shared<Qwen2ForCausalLM>(config, seed);
}

}  // namespace mixtrain::qwen2
