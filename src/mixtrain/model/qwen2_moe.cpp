#include "mixtrain/model/qwen2_moe.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/model/layers.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/moe_experts.h"
#include "mixtrain/model/recompute.h"

namespace mixtrain::qwen2_moe {
namespace {

// What distinguishes Qwen3-MoE from Qwen2-MoE here (the router and experts are the same code).
struct MoeOptions {
  AttentionOptions attention;
  bool shared_expert = true;  // Qwen2-MoE's sigmoid-gated shared expert; Qwen3-MoE has none
};

class Qwen2MoeSparseMoeBlock : public torch::nn::Module {
 public:
  Qwen2MoeSparseMoeBlock(const ModelConfig& c, const ParamAccess& access, bool with_shared_expert)
      : top_k_(moe_config(c).num_experts_per_tok), norm_topk_prob_(moe_config(c).norm_topk_prob) {
    gate =
        register_module("gate", std::make_shared<Linear>(c.hidden_size, moe_config(c).num_experts,
                                                         false, access.child("gate")));
    experts = register_module(
        "experts",
        std::make_shared<MoeExperts>(moe_config(c).num_experts, c.hidden_size,
                                     moe_config(c).moe_intermediate_size, access.child("experts")));
    if (!with_shared_expert) return;
    shared_expert = register_module(
        "shared_expert",
        std::make_shared<SwiGLUMLP>(c.hidden_size, moe_config(c).shared_expert_intermediate_size,
                                    access.child("shared_expert")));
    shared_expert_gate = register_module(
        "shared_expert_gate",
        std::make_shared<Linear>(c.hidden_size, 1, false, access.child("shared_expert_gate")));
  }

  // x [B, S, H] -> ([B, S, H], router_logits [B*S, E] in the compute dtype).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    const auto hidden = x.reshape({-1, x.size(-1)});
    auto router_logits = gate->forward(hidden);
    auto [routing_weights, selected_experts] = route_top_k(router_logits, top_k_, norm_topk_prob_);
    routing_weights = routing_weights.to(hidden.scalar_type());
    auto out = experts->forward(hidden, selected_experts, routing_weights);
    if (shared_expert) {
      out = out +
            torch::sigmoid(shared_expert_gate->forward(hidden)) * shared_expert->forward(hidden);
    }
    return {out.view(x.sizes()), router_logits};
  }

  std::shared_ptr<Linear> gate;
  std::shared_ptr<MoeExperts> experts;
  std::shared_ptr<SwiGLUMLP> shared_expert;    // null without a shared expert
  std::shared_ptr<Linear> shared_expert_gate;  // null without a shared expert

 private:
  int64_t top_k_;
  bool norm_topk_prob_;
};

class Qwen2MoeDecoderLayer : public torch::nn::Module {
 public:
  Qwen2MoeDecoderLayer(const ModelConfig& c, const ParamAccess& access, const MoeOptions& options) {
    // Registration order = HF's, so named_parameters() lists in state_dict order.
    self_attn = register_module("self_attn", std::make_shared<Qwen2Attention>(
                                                 c, access.child("self_attn"), options.attention));
    mlp = register_module("mlp", std::make_shared<Qwen2MoeSparseMoeBlock>(c, access.child("mlp"),
                                                                          options.shared_expert));
    input_layernorm = register_module(
        "input_layernorm",
        std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, access.child("input_layernorm")));
    post_attention_layernorm =
        register_module("post_attention_layernorm",
                        std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps,
                                                  access.child("post_attention_layernorm")));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& cos,
                                                  const torch::Tensor& sin) {
    auto h = x + self_attn->forward(input_layernorm->forward(x), cos, sin);
    auto [mlp_out, router_logits] = mlp->forward(post_attention_layernorm->forward(h));
    return {h + mlp_out, router_logits};
  }

  std::shared_ptr<Qwen2Attention> self_attn;
  std::shared_ptr<Qwen2MoeSparseMoeBlock> mlp;
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
};

class Qwen2MoeModel : public torch::nn::Module {
 public:
  Qwen2MoeModel(const ModelConfig& c, const ParamAccess& access, const MoeOptions& options)
      : config_(c), access_(access) {
    embed_tokens = register_module(
        "embed_tokens",
        std::make_shared<Embedding>(c.vocab_size, c.hidden_size, access.child("embed_tokens")));
    auto list = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_layers; ++i) {
      layers.push_back(std::make_shared<Qwen2MoeDecoderLayer>(
          c, access.child("layers." + std::to_string(i)), options));
      list->push_back(layers.back());
    }
    norm = register_module(
        "norm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, access.child("norm")));
  }

  // -> (final hidden states [B, S, H], router logits of every layer)
  // The layers recomputes_layer(i, recompute_every) picks are recomputed in backward
  // (recompute.h), router logits included.
  std::pair<torch::Tensor, std::vector<torch::Tensor>> forward(const torch::Tensor& input_ids,
                                                               int64_t recompute_every) {
    auto [cos, sin] = rotary_(input_ids, config_, access_);
    auto h = embed_tokens->forward(input_ids);
    std::vector<torch::Tensor> router_logits;
    router_logits.reserve(layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
      Qwen2MoeDecoderLayer& layer = *layers[i];
      if (!recomputes_layer(static_cast<int64_t>(i), recompute_every)) {
        auto [out, logits] = layer.forward(h, cos, sin);
        h = out;
        router_logits.push_back(logits);
        continue;
      }
      auto outs = recompute_in_backward(
          [&layer, cos = cos, sin = sin](const std::vector<torch::Tensor>& in) {
            auto [out, logits] = layer.forward(in[0], cos, sin);
            return std::vector<torch::Tensor>{out, logits};
          },
          {h});
      h = outs[0];
      router_logits.push_back(outs[1]);
    }
    return {norm->forward(h), std::move(router_logits)};
  }

  std::shared_ptr<Embedding> embed_tokens;
  std::vector<std::shared_ptr<Qwen2MoeDecoderLayer>> layers;  // registered as "layers.N"
  std::shared_ptr<RMSNorm> norm;

 private:
  ModelConfig config_;
  RotaryTables rotary_;  // per sequence length and device
  ParamAccess access_;
};

class Qwen2MoeForCausalLM : public Qwen2FamilyForCausalLM<Qwen2MoeModel> {
 public:
  // label: "qwen2_moe" or "qwen3_moe".
  Qwen2MoeForCausalLM(const ModelConfig& c, uint64_t seed, const char* label,
                      const MoeOptions& options)
      : Qwen2FamilyForCausalLM(c, label, options) {
    // Each module's parameters get the role of the module (causal_lm.h), from the module tree.
    assign_common_roles();
    // Router, shared-expert gate, routed experts and norms stay whole on every tp rank (the
    // experts run redundantly on each: expert-tensor-parallelism is not offered).
    assign_common_tp_dims();
    for (size_t i = 0; i < model->layers.size(); ++i) {
      const auto& mlp = *model->layers[i]->mlp;
      const std::string p = layer_prefix(i) + "mlp.";
      assign_param_role(p + "gate.", *mlp.gate, ParamRole::kRouter);
      assign_param_role(p + "experts.", *mlp.experts, ParamRole::kExpert);
      if (!mlp.shared_expert) continue;
      assign_param_role(p + "shared_expert.", *mlp.shared_expert, ParamRole::kMlp);
      assign_mlp_tp_dims(p + "shared_expert.", *mlp.shared_expert);
      assign_param_role(p + "shared_expert_gate.", *mlp.shared_expert_gate, ParamRole::kRouter);
    }
    init_hf_weights(*this, seed);
  }

  CausalLMOutput forward(const torch::Tensor& input_ids) override {
    auto [hidden, router_logits] =
        model->forward(model_input(input_ids), activation_checkpointing());
    CausalLMOutput out;
    // Only the logits take output_dtype: the aux loss stays float32 (contract above).
    out.logits = logits(hidden);
    // With context parallelism the statistics are the whole sequence's (summed over cp).
    out.aux_loss = load_balancing_loss(router_logits, moe_config(config_).num_experts,
                                       moe_config(config_).num_experts_per_tok, context_parallel());
    return out;
  }
};

// The checks both MoE models need.
void validate_moe(const ModelConfig& c) {
  validate_qwen2_common(c);
  require_model_key(moe_config(c).moe_intermediate_size > 0, "moe_intermediate_size",
                    "must be > 0");
  require_model_key(moe_config(c).num_experts > 0, "num_experts", "must be > 0");
  require_model_key(moe_config(c).num_experts_per_tok > 0 &&
                        moe_config(c).num_experts_per_tok <= moe_config(c).num_experts,
                    "num_experts_per_tok",
                    "must be in [1, num_experts = " + std::to_string(moe_config(c).num_experts) +
                        "], got " + std::to_string(moe_config(c).num_experts_per_tok));
}

}  // namespace

std::shared_ptr<CausalLM> make_qwen2_moe(const ModelConfig& config, uint64_t seed) {
  validate_moe(config);
  require_model_key(moe_config(config).shared_expert_intermediate_size > 0,
                    "shared_expert_intermediate_size", "must be > 0");
  MoeOptions options;
  options.attention = {/*qkv_bias=*/config.attention_bias, /*o_bias=*/false};
  return std::make_shared<Qwen2MoeForCausalLM>(config, seed, "qwen2_moe", options);
}

std::shared_ptr<CausalLM> make_qwen3_moe(const ModelConfig& config, uint64_t seed) {
  validate_moe(config);
  MoeOptions options;
  options.attention = {/*qkv_bias=*/config.attention_bias, /*o_bias=*/config.attention_bias,
                       /*qk_norm=*/true};
  options.shared_expert = false;
  return std::make_shared<Qwen2MoeForCausalLM>(config, seed, "qwen3_moe", options);
}

namespace {

// The keys both MoE models read.
void check_moe(const ModelConfig& m, const ConfigChecker& check) {
  check.positive("model.moe_intermediate_size", moe_config(m).moe_intermediate_size);
  check.positive("model.num_experts", moe_config(m).num_experts);
  check.positive("model.num_experts_per_tok", moe_config(m).num_experts_per_tok);
  check.non_negative("model.router_aux_loss_coef", moe_config(m).router_aux_loss_coef);
  if (moe_config(m).num_experts_per_tok > moe_config(m).num_experts) {
    check.fail_value(
        "model.num_experts_per_tok",
        "must be <= model.num_experts (" + std::to_string(moe_config(m).num_experts) + ")");
  }
}

ModelSection moe_section(const std::string& name) {
  ModelSection section;
  section.name = name;
  section.own_keys = {"model.moe_intermediate_size", "model.num_experts",
                      "model.num_experts_per_tok",   "model.router_aux_loss_coef",
                      "model.attention_bias",        "model.norm_topk_prob"};
  section.check = check_moe;
  section.routed_experts = [](const ModelConfig& m) { return moe_config(m).num_experts; };
  // The routed experts are not split over tp.
  section.tp_split_sizes = [](const ModelConfig&) {
    return std::vector<std::pair<std::string, int64_t>>{};
  };
  return section;
}

}  // namespace

ModelEntry qwen2_moe_entry() {
  ModelSection section = moe_section("qwen2_moe");
  section.own_keys.insert(section.own_keys.begin() + 3, "model.shared_expert_intermediate_size");
  section.check = [](const ModelConfig& m, const ConfigChecker& check) {
    check_moe(m, check);
    check.positive("model.shared_expert_intermediate_size",
                   moe_config(m).shared_expert_intermediate_size);
  };
  // Column-parallel shared-expert widths.
  section.tp_split_sizes = [](const ModelConfig& m) {
    return std::vector<std::pair<std::string, int64_t>>{
        {"model.shared_expert_intermediate_size", moe_config(m).shared_expert_intermediate_size}};
  };
  HfFamily hf;
  hf.architecture = "Qwen2MoeForCausalLM";
  hf.moe = true;
  hf.shared_expert = true;
  hf.attention_bias_field = "qkv_bias";
  hf.attention_bias_default = true;
  return {"qwen2_moe", make_qwen2_moe, section, hf};
}

ModelEntry qwen3_moe_entry() {
  ModelSection section = moe_section("qwen3_moe");
  section.qk_norm = true;
  HfFamily hf;
  hf.architecture = "Qwen3MoeForCausalLM";
  hf.moe = true;
  hf.attention_bias_field = "attention_bias";
  // transformers 5 names the expert count num_local_experts; 4.x num_experts.
  hf.experts_field = "num_local_experts";
  hf.experts_field_older = "num_experts";
  return {"qwen3_moe", make_qwen3_moe, section, hf};
}

std::pair<torch::Tensor, torch::Tensor> route_top_k(const torch::Tensor& router_logits,
                                                    int64_t top_k, bool norm_topk_prob) {
  const auto probs = torch::softmax(router_logits, -1, torch::kFloat32);
  auto [weights, indices] = probs.topk(top_k, -1);
  // w_i / sum_j w_j over the k chosen, in float32 (HF divides before its cast).
  if (norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  return {weights, indices};
}

torch::Tensor load_balancing_loss(const std::vector<torch::Tensor>& router_logits,
                                  int64_t num_experts, int64_t top_k, ContextParallelHooks* cp) {
  if (router_logits.empty()) return torch::zeros({}, torch::kFloat32);
  std::vector<torch::Tensor> as_float;
  as_float.reserve(router_logits.size());
  for (const auto& l : router_logits) as_float.push_back(l.to(torch::kFloat32));
  const auto logits = torch::cat(as_float, 0);
  const auto routing_weights = torch::softmax(logits, -1);
  const auto selected_experts = std::get<1>(routing_weights.topk(top_k, -1));
  // Top-k indices of one token are distinct, so this 0/1 mask equals HF's one_hot summed over
  // the k slots.
  const auto expert_mask = torch::zeros_like(routing_weights).scatter_(1, selected_experts, 1.0);
  if (cp != nullptr) {
    // T and both per-expert sums over the cp group's tokens; the sum's backward sums every
    // rank's gradient of its (identical) loss, so each rank's probabilities get theirs.
    const auto sums =
        cp->all_reduce_sum(torch::stack({expert_mask.sum(0), routing_weights.sum(0)}));
    const double tokens = static_cast<double>(logits.size(0) * cp->cp_size());
    return (sums[0] / tokens * (sums[1] / tokens)).sum() * double(num_experts);
  }
  const auto tokens_per_expert = expert_mask.mean(0);
  const auto router_prob_per_expert = routing_weights.mean(0);
  return (tokens_per_expert * router_prob_per_expert).sum() * double(num_experts);
}

}  // namespace mixtrain::qwen2_moe
