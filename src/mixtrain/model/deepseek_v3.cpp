#include "mixtrain/model/deepseek_v3.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/model/attention.h"
#include "mixtrain/model/deepseek_v3_config.h"
#include "mixtrain/model/hf_config.h"
#include "mixtrain/model/layers.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/moe_experts.h"
#include "mixtrain/model/recompute.h"

namespace mixtrain::deepseek_v3 {
namespace {

using json = nlohmann::json;

// HF DeepseekV3Attention (MLA), as the header describes. Tensor parallelism (Megatron's MLA
// layout): q_proj / q_b_proj and kv_b_proj column-parallel by head, o_proj row-parallel; the
// low-rank down projections and their norms whole on every tp rank; the normed latents and the
// shared rotary key pass through copy_to_tp before the per-head parts use them (so their
// gradients, and with them the norms' and down projections', are summed over every rank's
// heads).
class MlaAttention : public torch::nn::Module {
 public:
  MlaAttention(const ModelConfig& c, const ParamAccess& access)
      : num_heads_(c.num_heads), access_(access) {
    const DeepseekV3Config& d = deepseek_v3_config(c);
    nope_ = d.qk_nope_head_dim;
    rope_ = d.qk_rope_head_dim;
    v_dim_ = d.v_head_dim;
    kv_rank_ = d.kv_lora_rank;
    interleave_ = d.rope_interleave;
    scale_ = 1.0 / std::sqrt(static_cast<double>(nope_ + rope_));
    // HF yarn_apply_mscale: with YaRN and mscale_all_dim, times m(factor, mscale_all_dim)^2.
    if (c.rope_scaling == "yarn" && c.rope_yarn_mscale_all_dim != 0) {
      const double m = yarn_mscale(c.rope_scaling_factor, c.rope_yarn_mscale_all_dim);
      scale_ *= m * m;
    }
    const int64_t q_out = num_heads_ * (nope_ + rope_);
    // Registration order = HF's.
    if (d.q_lora_rank == 0) {
      q_proj = register_module(
          "q_proj", std::make_shared<Linear>(c.hidden_size, q_out, false, access.child("q_proj"),
                                             TpStyle::kColumn));
    } else {
      q_a_proj = register_module(
          "q_a_proj", std::make_shared<Linear>(c.hidden_size, d.q_lora_rank, c.attention_bias,
                                               access.child("q_a_proj")));
      q_a_layernorm = register_module(
          "q_a_layernorm",
          std::make_shared<RMSNorm>(d.q_lora_rank, c.rms_norm_eps, access.child("q_a_layernorm")));
      q_b_proj = register_module(
          "q_b_proj", std::make_shared<Linear>(d.q_lora_rank, q_out, false,
                                               access.child("q_b_proj"), TpStyle::kColumn));
    }
    kv_a_proj_with_mqa =
        register_module("kv_a_proj_with_mqa",
                        std::make_shared<Linear>(c.hidden_size, kv_rank_ + rope_, c.attention_bias,
                                                 access.child("kv_a_proj_with_mqa")));
    kv_a_layernorm = register_module(
        "kv_a_layernorm",
        std::make_shared<RMSNorm>(kv_rank_, c.rms_norm_eps, access.child("kv_a_layernorm")));
    kv_b_proj = register_module(
        "kv_b_proj", std::make_shared<Linear>(kv_rank_, num_heads_ * (nope_ + v_dim_), false,
                                              access.child("kv_b_proj"), TpStyle::kColumn));
    o_proj = register_module(
        "o_proj", std::make_shared<Linear>(num_heads_ * v_dim_, c.hidden_size, c.attention_bias,
                                           access.child("o_proj"), TpStyle::kRow));
  }

  // x [B, S, H]; cos/sin [S, dr] float32.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
    const int64_t bsz = x.size(0), len = x.size(1);
    TensorParallelHooks* tp = access_.tensor_parallel();
    const int64_t tp_size = tp != nullptr ? tp->tp_size() : 1;
    const int64_t heads = num_heads_ / tp_size;  // this rank's
    const auto q_states = q_proj ? q_proj->forward(tp_block_input(access_, x))
                                 : q_b_proj->forward(tp_block_input(
                                       access_, q_a_layernorm->forward(q_a_proj->forward(x))));
    const auto q = q_states.view({bsz, len, heads, nope_ + rope_}).transpose(1, 2);
    auto q_pe = q.narrow(-1, nope_, rope_);
    const auto compressed = kv_a_proj_with_mqa->forward(x);
    const auto latent =
        tp_block_input(access_, kv_a_layernorm->forward(compressed.narrow(-1, 0, kv_rank_)));
    auto k_pe = tp_block_input(access_, compressed.narrow(-1, kv_rank_, rope_))
                    .reshape({bsz, 1, len, rope_});
    if (interleave_) {
      q_pe = apply_rotary_pos_emb_interleaved(q_pe, cos, sin);
      k_pe = apply_rotary_pos_emb_interleaved(k_pe, cos, sin);
    } else {
      q_pe = apply_rotary_pos_emb(q_pe, cos, sin);
      k_pe = apply_rotary_pos_emb(k_pe, cos, sin);
    }
    const auto kv =
        kv_b_proj->forward(latent).view({bsz, len, heads, nope_ + v_dim_}).transpose(1, 2);
    // The attention kernels take one head dim D and scale by D^-1/2: q, k and v are zero-padded
    // to D = max(dn + dr, dv) (zeros add nothing to a dot product or an output column) and q is
    // scaled by scale x D^1/2, so the logits are q . k x scale exactly as HF forms them.
    const int64_t qk = nope_ + rope_, dim = std::max(qk, v_dim_);
    auto query = torch::cat({q.narrow(-1, 0, nope_), q_pe}, -1);
    auto key = torch::cat({kv.narrow(-1, 0, nope_), k_pe.expand({bsz, heads, len, rope_})}, -1);
    auto value = kv.narrow(-1, nope_, v_dim_);
    const double factor = scale_ * std::sqrt(static_cast<double>(dim));
    if (factor != 1.0) query = query * factor;
    if (qk < dim) {
      query = torch::constant_pad_nd(query, {0, dim - qk});
      key = torch::constant_pad_nd(key, {0, dim - qk});
    }
    if (v_dim_ < dim) value = torch::constant_pad_nd(value, {0, dim - v_dim_});
    ContextParallelHooks* cp = access_.context_parallel();
    if (MaxLogitRecorder* recorder = access_.max_logit_recorder()) {
      const int64_t tp_rank = tp != nullptr ? tp->tp_rank() : 0;
      recorder->record(access_.prefix, num_heads_, tp_rank * heads,
                       cp != nullptr ? cp->max_logits(query, key) : causal_max_logits(query, key));
    }
    auto out = attention_on_gemm_path(query, key, value,
                                      [&](const torch::Tensor& q, const torch::Tensor& k,
                                          const torch::Tensor& v, AttentionKernel kernel) {
                                        return cp != nullptr ? cp->attention(q, k, v, kernel)
                                                             : causal_attention(q, k, v, kernel);
                                      });
    if (v_dim_ < dim) out = out.narrow(-1, 0, v_dim_);
    return o_proj->forward(out.transpose(1, 2).reshape({bsz, len, heads * v_dim_}));
  }

  std::shared_ptr<Linear> q_proj, q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj;
  std::shared_ptr<RMSNorm> q_a_layernorm, kv_a_layernorm;

 private:
  int64_t num_heads_, nope_ = 0, rope_ = 0, v_dim_ = 0, kv_rank_ = 0;
  bool interleave_ = true;
  double scale_ = 1.0;
  ParamAccess access_;
};

// HF DeepseekV3TopkRouter: the router weight, and the selection bias beside it (not a
// parameter: balancing state, model_state()).
class Router : public WeightedLayer {
 public:
  Router(int64_t num_experts, int64_t hidden_size, ParamAccess access)
      : WeightedLayer({num_experts, hidden_size}, std::move(access)),
        bias(torch::zeros({num_experts}, torch::kFloat32)),
        load(torch::zeros({num_experts}, torch::kFloat32)) {}

  // hidden [T, H] -> float32 router logits [T, E] (HF computes them in float32).
  torch::Tensor forward(const torch::Tensor& hidden) {
    const auto w = access_.unshard("weight", weight);
    return access_.post_forward({"weight"},
                                dense(hidden.to(torch::kFloat32), w.to(torch::kFloat32)));
  }

  torch::Tensor bias;  // float32 [E]: e_score_correction_bias
  torch::Tensor load;  // float32 [E]: tokens that chose each expert since the last update
};

class DeepseekV3Moe : public torch::nn::Module {
 public:
  DeepseekV3Moe(const ModelConfig& c, const ParamAccess& access) : config_(c) {
    const MoeConfig& moe = moe_config(c);
    gate = register_module(
        "gate", std::make_shared<Router>(moe.num_experts, c.hidden_size, access.child("gate")));
    experts = register_module("experts", std::make_shared<MoeExperts>(
                                             moe.num_experts, c.hidden_size,
                                             moe.moe_intermediate_size, access.child("experts")));
    shared_experts = register_module(
        "shared_experts",
        std::make_shared<SwiGLUMLP>(
            c.hidden_size, moe.moe_intermediate_size * deepseek_v3_config(c).n_shared_experts,
            access.child("shared_experts")));
  }

  // x [B, S, H] -> (output [B, S, H], balance loss scalar float32). count_load: add this
  // forward's expert choices to gate->load.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, bool count_load,
                                                  ContextParallelHooks* cp) {
    const MoeConfig& moe = moe_config(config_);
    const DeepseekV3Config& d = deepseek_v3_config(config_);
    const auto hidden = x.reshape({-1, x.size(-1)});
    const auto logits = gate->forward(hidden);
    if (gate->bias.device() != logits.device()) {
      gate->bias = gate->bias.to(logits.device());
      gate->load = gate->load.to(logits.device());
    }
    const Routing r =
        route_grouped_sigmoid(logits, gate->bias, moe.num_experts_per_tok, d.n_group, d.topk_group,
                              moe.norm_topk_prob, d.routed_scaling_factor);
    if (count_load) {
      torch::NoGradGuard no_grad;
      gate->load.index_add_(0, r.indices.reshape({-1}),
                            torch::ones({r.indices.numel()}, gate->load.options()));
    }
    auto out = experts->forward(hidden, r.indices, r.weights.to(hidden.scalar_type()));
    out = out + shared_experts->forward(hidden);
    const auto aux = moe.router_aux_loss_coef > 0
                         ? sequence_balance_loss(r.scores, r.indices, x.size(0), cp)
                         : torch::zeros({}, logits.options());
    return {out.view(x.sizes()), aux};
  }

  std::shared_ptr<Router> gate;
  std::shared_ptr<MoeExperts> experts;
  std::shared_ptr<SwiGLUMLP> shared_experts;

 private:
  ModelConfig config_;
};

class DeepseekV3DecoderLayer : public torch::nn::Module {
 public:
  DeepseekV3DecoderLayer(const ModelConfig& c, const ParamAccess& access, bool dense) {
    self_attn =
        register_module("self_attn", std::make_shared<MlaAttention>(c, access.child("self_attn")));
    if (dense) {
      dense_mlp = register_module(
          "mlp",
          std::make_shared<SwiGLUMLP>(c.hidden_size, c.intermediate_size, access.child("mlp")));
    } else {
      moe = register_module("mlp", std::make_shared<DeepseekV3Moe>(c, access.child("mlp")));
    }
    input_layernorm = register_module(
        "input_layernorm",
        std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, access.child("input_layernorm")));
    post_attention_layernorm =
        register_module("post_attention_layernorm",
                        std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps,
                                                  access.child("post_attention_layernorm")));
  }

  // -> (output, balance loss: 0 for a dense layer)
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& cos,
                                                  const torch::Tensor& sin, bool count_load,
                                                  ContextParallelHooks* cp) {
    const auto h = x + self_attn->forward(input_layernorm->forward(x), cos, sin);
    const auto normed = post_attention_layernorm->forward(h);
    if (dense_mlp) {
      return {h + dense_mlp->forward(normed), torch::zeros({}, x.options().dtype(torch::kFloat32))};
    }
    auto [out, aux] = moe->forward(normed, count_load, cp);
    return {h + out, aux};
  }

  std::shared_ptr<MlaAttention> self_attn;
  std::shared_ptr<SwiGLUMLP> dense_mlp;  // layers < first_k_dense_replace
  std::shared_ptr<DeepseekV3Moe> moe;    // the others
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
};

class DeepseekV3Model : public torch::nn::Module {
 public:
  DeepseekV3Model(const ModelConfig& c, const ParamAccess& access) : config_(c), access_(access) {
    embed_tokens = register_module(
        "embed_tokens",
        std::make_shared<Embedding>(c.vocab_size, c.hidden_size, access.child("embed_tokens")));
    auto list = register_module("layers", torch::nn::ModuleList());
    const int64_t dense = deepseek_v3_config(c).first_k_dense_replace;
    for (int64_t i = 0; i < c.num_layers; ++i) {
      layers.push_back(std::make_shared<DeepseekV3DecoderLayer>(
          c, access.child("layers." + std::to_string(i)), i < dense));
      list->push_back(layers.back());
    }
    norm = register_module(
        "norm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, access.child("norm")));
  }

  // -> (final hidden states, the MoE layers' summed balance loss)
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& input_ids,
                                                  int64_t recompute_every, bool count_load) {
    auto [cos, sin] = rotary_(input_ids, config_, access_);
    ContextParallelHooks* cp = access_.context_parallel();
    auto h = embed_tokens->forward(input_ids);
    auto aux = torch::zeros({}, h.options().dtype(torch::kFloat32));
    for (size_t i = 0; i < layers.size(); ++i) {
      DeepseekV3DecoderLayer& layer = *layers[i];
      if (!recomputes_layer(static_cast<int64_t>(i), recompute_every)) {
        auto [out, layer_aux] = layer.forward(h, cos, sin, count_load, cp);
        h = out;
        aux = aux + layer_aux;
        continue;
      }
      // The backward's second run of the layer does not count its choices again.
      auto outs = recompute_in_backward(
          [&layer, cos = cos, sin = sin, count_load, cp](const std::vector<torch::Tensor>& in) {
            auto [out, layer_aux] =
                layer.forward(in[0], cos, sin, count_load && !recomputing(), cp);
            return std::vector<torch::Tensor>{out, layer_aux};
          },
          {h});
      h = outs[0];
      aux = aux + outs[1];
    }
    return {norm->forward(h), aux};
  }

  std::shared_ptr<Embedding> embed_tokens;
  std::vector<std::shared_ptr<DeepseekV3DecoderLayer>> layers;
  std::shared_ptr<RMSNorm> norm;

 private:
  ModelConfig config_;
  RotaryTables rotary_;
  ParamAccess access_;
};

class DeepseekV3ForCausalLM : public Qwen2FamilyForCausalLM<DeepseekV3Model> {
 public:
  DeepseekV3ForCausalLM(const ModelConfig& c, uint64_t seed)
      : Qwen2FamilyForCausalLM(c, "deepseek_v3") {
    assign_param_role("model.embed_tokens.", *model->embed_tokens, ParamRole::kEmbedding);
    // Muon's per-head blocks and QK-clip's factors read these (deepseek_v3_config.h).
    const MlaHeadLayouts layouts = mla_head_layouts(c);
    const HeadLayout &query = layouts.query, &key_value = layouts.key_value,
                     &output = layouts.output;
    for (size_t i = 0; i < model->layers.size(); ++i) {
      const auto& layer = *model->layers[i];
      const std::string p = layer_prefix(i), attn = p + "self_attn.";
      const auto& a = *layer.self_attn;
      if (a.q_proj) {
        assign_param_role(attn + "q_proj.", *a.q_proj, ParamRole::kAttentionQuery, attn, query);
      } else {
        assign_param_role(attn + "q_a_proj.", *a.q_a_proj, ParamRole::kAttentionLatent, attn);
        assign_param_role(attn + "q_a_layernorm.", *a.q_a_layernorm, ParamRole::kNorm);
        assign_param_role(attn + "q_b_proj.", *a.q_b_proj, ParamRole::kAttentionQuery, attn, query);
      }
      assign_param_role(attn + "kv_a_proj_with_mqa.", *a.kv_a_proj_with_mqa,
                        ParamRole::kAttentionLatent, attn);
      assign_param_role(attn + "kv_a_layernorm.", *a.kv_a_layernorm, ParamRole::kNorm);
      assign_param_role(attn + "kv_b_proj.", *a.kv_b_proj, ParamRole::kAttentionKeyValue, attn,
                        key_value);
      assign_param_role(attn + "o_proj.", *a.o_proj, ParamRole::kAttentionOutput, attn, output);
      if (layer.dense_mlp) {
        assign_param_role(p + "mlp.", *layer.dense_mlp, ParamRole::kMlp);
      } else {
        assign_param_role(p + "mlp.gate.", *layer.moe->gate, ParamRole::kRouter);
        assign_param_role(p + "mlp.experts.", *layer.moe->experts, ParamRole::kExpert);
        assign_param_role(p + "mlp.shared_experts.", *layer.moe->shared_experts, ParamRole::kMlp);
      }
      assign_param_role(p + "input_layernorm.", *layer.input_layernorm, ParamRole::kNorm);
      assign_param_role(p + "post_attention_layernorm.", *layer.post_attention_layernorm,
                        ParamRole::kNorm);
    }
    assign_param_role("model.norm.", *model->norm, ParamRole::kNorm);
    if (lm_head) assign_param_role("lm_head.", *lm_head, ParamRole::kOutputHead);
    assign_tp_dims();
    init_hf_weights(*this, seed);
  }

  // Tensor parallelism (MlaAttention): the vocabulary of embed_tokens and lm_head, the query
  // and kv up projections by head (dim 0), o_proj's columns (dim 1; its bias whole), the dense
  // MLP and the shared experts as SwiGLU MLPs; the latent projections and norms, the router and
  // the routed experts whole on every tp rank.
  void assign_tp_dims() {
    assign_tp_dim("model.embed_tokens.", *model->embed_tokens, 0);
    for (size_t i = 0; i < model->layers.size(); ++i) {
      const auto& layer = *model->layers[i];
      const auto& a = *layer.self_attn;
      const std::string p = layer_prefix(i), attn = p + "self_attn.";
      if (a.q_proj) assign_tp_dim(attn + "q_proj.", *a.q_proj, 0);
      if (a.q_b_proj) assign_tp_dim(attn + "q_b_proj.", *a.q_b_proj, 0);
      assign_tp_dim(attn + "kv_b_proj.", *a.kv_b_proj, 0);
      assign_tp_dim(attn + "o_proj.", *a.o_proj, 1, /*weight_only=*/true);
      if (layer.dense_mlp) assign_mlp_tp_dims(p + "mlp.", *layer.dense_mlp);
      if (layer.moe) assign_mlp_tp_dims(p + "mlp.shared_experts.", *layer.moe->shared_experts);
    }
    if (lm_head) assign_tp_dim("lm_head.", *lm_head, 0);
  }

  CausalLMOutput forward(const torch::Tensor& input_ids) override {
    auto [hidden, aux] = model->forward(model_input(input_ids), activation_checkpointing(),
                                        collects_state_statistics());
    CausalLMOutput out;
    out.logits = logits(hidden);
    out.aux_loss = aux;
    return out;
  }

  std::map<std::string, torch::Tensor> model_state() override {
    std::map<std::string, torch::Tensor> state;
    for (size_t i = 0; i < model->layers.size(); ++i) {
      if (const auto& moe = model->layers[i]->moe) {
        state[layer_prefix(i) + "mlp.gate.e_score_correction_bias"] = moe->gate->bias;
      }
    }
    return state;
  }

  void set_model_state(const std::string& name, const torch::Tensor& value) override {
    for (size_t i = 0; i < model->layers.size(); ++i) {
      const auto& moe = model->layers[i]->moe;
      if (!moe || name != layer_prefix(i) + "mlp.gate.e_score_correction_bias") continue;
      TORCH_CHECK(value.sizes() == moe->gate->bias.sizes(), "deepseek_v3: ", name, " must be ",
                  moe->gate->bias.sizes(), ", got ", value.sizes());
      moe->gate->bias = value.to(moe->gate->bias.device(), torch::kFloat32).clone();
      return;
    }
    CausalLM::set_model_state(name, value);  // throws: not ours
  }

  // bias_e += speed * sign(mean load - load_e) per MoE layer, from the loads summed over the
  // ranks that saw other tokens; then the counts start anew.
  void update_model_state(const std::function<void(torch::Tensor&)>& sum_over_data) override {
    std::vector<Router*> routers;
    for (const auto& layer : model->layers) {
      if (layer->moe) routers.push_back(layer->moe->gate.get());
    }
    if (routers.empty()) return;
    std::vector<torch::Tensor> loads;
    for (Router* r : routers) loads.push_back(r->load);
    torch::Tensor all = torch::stack(loads);  // [layers, E], one collective for all
    sum_over_data(all);
    const double speed = deepseek_v3_config(config_).bias_update_speed;
    torch::NoGradGuard no_grad;
    for (size_t l = 0; l < routers.size(); ++l) {
      const auto load = all[static_cast<int64_t>(l)];
      routers[l]->bias.add_(torch::sign(load.mean() - load), speed);
      routers[l]->load.zero_();
    }
  }
};

// The model's own shape rules (validation refuses each first, naming the key as written).
void validate(const ModelConfig& c) {
  const DeepseekV3Config& d = deepseek_v3_config(c);
  const MoeConfig& moe = moe_config(c);
  require_model_key(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0,
                    "vocab_size/hidden_size/num_layers/num_heads", "must be > 0");
  require_model_key(c.num_kv_heads == c.num_heads, "num_kv_heads",
                    "must equal num_heads (" + std::to_string(c.num_heads) +
                        ") for deepseek_v3: every head has its own keys and values");
  require_model_key(d.qk_rope_head_dim > 0 && d.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim",
                    "must be even and > 0, got " + std::to_string(d.qk_rope_head_dim));
  require_model_key(c.head_dim == d.qk_rope_head_dim, "head_dim",
                    "must equal qk_rope_head_dim (" + std::to_string(d.qk_rope_head_dim) +
                        ") for deepseek_v3 (the rotary dims, as HF's head_dim), got " +
                        std::to_string(c.head_dim));
  require_model_key(d.qk_nope_head_dim > 0, "qk_nope_head_dim", "must be > 0");
  require_model_key(d.v_head_dim > 0, "v_head_dim", "must be > 0");
  require_model_key(d.kv_lora_rank > 0, "kv_lora_rank", "must be > 0");
  require_model_key(d.q_lora_rank >= 0, "q_lora_rank", "must be >= 0 (0: no query compression)");
  require_model_key(d.first_k_dense_replace >= 0 && d.first_k_dense_replace <= c.num_layers,
                    "first_k_dense_replace", "must be in [0, num_layers]");
  require_model_key(d.first_k_dense_replace == 0 || c.intermediate_size > 0, "intermediate_size",
                    "must be > 0 (the dense layers' width)");
  require_model_key(moe.num_experts > 1, "num_experts", "must be > 1");
  require_model_key(moe.moe_intermediate_size > 0, "moe_intermediate_size", "must be > 0");
  require_model_key(d.n_shared_experts > 0, "n_shared_experts", "must be > 0");
  require_model_key(
      d.n_group > 0 && moe.num_experts % d.n_group == 0 && moe.num_experts / d.n_group >= 2,
      "n_group",
      "must divide num_experts into groups of >= 2 experts (a group scores its two "
      "best), got " +
          std::to_string(d.n_group));
  require_model_key(d.topk_group > 0 && d.topk_group <= d.n_group, "topk_group",
                    "must be in [1, n_group]");
  require_model_key(moe.num_experts_per_tok > 0 &&
                        moe.num_experts_per_tok <= d.topk_group * (moe.num_experts / d.n_group),
                    "num_experts_per_tok", "must be in [1, topk_group x experts per group]");
  require_model_key(d.routed_scaling_factor > 0, "routed_scaling_factor", "must be > 0");
  require_model_key(c.rope_theta > 0 && c.max_seq_len > 0 && c.rms_norm_eps > 0,
                    "rope_theta/max_seq_len/rms_norm_eps", "must be > 0");
}

void check_section(const ModelConfig& m, const ConfigChecker& check) {
  const DeepseekV3Config& d = deepseek_v3_config(m);
  const MoeConfig& moe = moe_config(m);
  if (m.num_kv_heads != m.num_heads) {
    check.fail_value("model.num_kv_heads",
                     "must equal " + check.key("model.num_heads") + " (" +
                         std::to_string(m.num_heads) +
                         ") for deepseek_v3: multi-head latent attention gives every head its "
                         "own keys and values");
  }
  check.positive("model.qk_rope_head_dim", static_cast<double>(d.qk_rope_head_dim));
  if (d.qk_rope_head_dim % 2 != 0) {
    check.fail_value("model.qk_rope_head_dim", "must be even (rotary embeddings rotate pairs)");
  }
  if (m.head_dim != d.qk_rope_head_dim) {
    check.fail_value("model.head_dim", "must equal " + check.key("model.qk_rope_head_dim") + " (" +
                                           std::to_string(d.qk_rope_head_dim) +
                                           ") for deepseek_v3: the rotary dims, as Hugging "
                                           "Face's head_dim");
  }
  check.positive("model.qk_nope_head_dim", static_cast<double>(d.qk_nope_head_dim));
  check.positive("model.v_head_dim", static_cast<double>(d.v_head_dim));
  check.positive("model.kv_lora_rank", static_cast<double>(d.kv_lora_rank));
  check.non_negative("model.q_lora_rank", static_cast<double>(d.q_lora_rank));
  check.positive("model.moe_intermediate_size", static_cast<double>(moe.moe_intermediate_size));
  check.positive("model.num_experts_per_tok", static_cast<double>(moe.num_experts_per_tok));
  check.non_negative("model.router_aux_loss_coef", moe.router_aux_loss_coef);
  check.positive("model.n_shared_experts", static_cast<double>(d.n_shared_experts));
  check.positive("model.routed_scaling_factor", d.routed_scaling_factor);
  check.non_negative("model.bias_update_speed", d.bias_update_speed);
  if (moe.num_experts < 2) check.fail_value("model.num_experts", "must be >= 2");
  if (d.n_group < 1 || moe.num_experts % d.n_group != 0 || moe.num_experts / d.n_group < 2) {
    check.fail_value("model.n_group", "must divide " + check.key("model.num_experts") + " (" +
                                          std::to_string(moe.num_experts) +
                                          ") into groups of at least 2 experts (a group is "
                                          "scored by its two best)");
  }
  if (d.topk_group < 1 || d.topk_group > d.n_group) {
    check.fail_value("model.topk_group", "must be in [1, " + check.key("model.n_group") + " = " +
                                             std::to_string(d.n_group) + "]");
  }
  const int64_t reachable = d.topk_group * (moe.num_experts / std::max<int64_t>(d.n_group, 1));
  if (moe.num_experts_per_tok > reachable) {
    check.fail_value("model.num_experts_per_tok",
                     "must be <= topk_group x experts per group (" + std::to_string(reachable) +
                         "): a token chooses only among its groups' experts");
  }
  if (d.first_k_dense_replace < 0 || d.first_k_dense_replace > m.num_layers) {
    check.fail_value("model.first_k_dense_replace", "must be in [0, " +
                                                        check.key("model.num_layers") + " = " +
                                                        std::to_string(m.num_layers) + "]");
  }
  if (d.first_k_dense_replace > 0) check.positive("model.intermediate_size", m.intermediate_size);
}

// config.json's DeepSeek-V3 fields (transformers' DeepseekV3Config; DeepSeek's own configs
// spell the same fields and add scoring_func, topk_method, moe_layer_freq, seq_aux and
// aux_loss_alpha, read or refused here).
void read_hf_fields(const HfConfigReader& r, ModelConfig& m, const HfFamily::AddField& add) {
  DeepseekV3Config& d = deepseek_v3_config(m);
  r.only("scoring_func", "sigmoid", "DeepSeek-V3's sigmoid router");
  r.only("topk_method", "noaux_tc", "group-limited routing with the balancing bias");
  r.only("moe_layer_freq", 1, "every layer from first_k_dense_replace on is a MoE layer");
  m.intermediate_size = r.positive_int("intermediate_size");
  add("model.intermediate_size", "intermediate_size", true);
  if (const json* q = r.find("q_lora_rank")) {
    d.q_lora_rank = r.positive_int("q_lora_rank", *q);
    add("model.q_lora_rank", "q_lora_rank", true);
  } else {
    d.q_lora_rank = 0;
    add("model.q_lora_rank", "default: null (no query compression)", true);
  }
  const auto positive = [&](const char* field, int64_t& into) {
    into = r.positive_int(field);
    add(std::string("model.") + field, field, true);
  };
  positive("kv_lora_rank", d.kv_lora_rank);
  positive("qk_nope_head_dim", d.qk_nope_head_dim);
  positive("qk_rope_head_dim", d.qk_rope_head_dim);
  positive("v_head_dim", d.v_head_dim);
  positive("n_shared_experts", d.n_shared_experts);
  const auto optional_positive = [&](const char* field, int64_t& into, int64_t absent) {
    const json* value = r.find(field);
    into = value ? r.positive_int(field, *value) : absent;
    add(std::string("model.") + field, value ? field : "default: " + std::to_string(absent), true);
  };
  optional_positive("n_group", d.n_group, 1);
  optional_positive("topk_group", d.topk_group, 1);
  if (const json* k = r.find("first_k_dense_replace")) {
    if (!k->is_number_integer() || k->get<int64_t>() < 0) {
      r.fail("first_k_dense_replace", "must be an integer >= 0, got " + k->dump());
    }
    d.first_k_dense_replace = k->get<int64_t>();
    add("model.first_k_dense_replace", "first_k_dense_replace", true);
  } else {
    d.first_k_dense_replace = 0;
    add("model.first_k_dense_replace", "default: 0", true);
  }
  const json* scaling = r.find("routed_scaling_factor");
  d.routed_scaling_factor = scaling ? r.number("routed_scaling_factor", *scaling) : 1.0;
  add("model.routed_scaling_factor", scaling ? "routed_scaling_factor" : "default: 1.0", true);
  d.rope_interleave = r.boolean("rope_interleave", true);
  add("model.rope_interleave", r.find("rope_interleave") ? "rope_interleave" : "default: true",
      true);
  // DeepSeek-V3's norm_topk_prob is true by default (transformers' class default).
  moe_config(m).norm_topk_prob = r.boolean("norm_topk_prob", true);
  // The sequence-wise balance loss: DeepSeek's seq_aux with aux_loss_alpha, a training choice;
  // transformers computes none (router_aux_loss_coef 0 unless the file says otherwise).
  if (const json* alpha = r.find("aux_loss_alpha"); alpha && r.boolean("seq_aux", true)) {
    moe_config(m).router_aux_loss_coef = r.number("aux_loss_alpha", *alpha);
    add("model.router_aux_loss_coef", "aux_loss_alpha", false);
  } else {
    moe_config(m).router_aux_loss_coef = 0.0;
    add("model.router_aux_loss_coef", "default: 0 (transformers computes no auxiliary loss)",
        false);
  }
}

void write_hf_fields(const ModelConfig& m, json& j) {
  const DeepseekV3Config& d = deepseek_v3_config(m);
  j["intermediate_size"] = m.intermediate_size;
  j["q_lora_rank"] = d.q_lora_rank > 0 ? json(d.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = d.kv_lora_rank;
  j["qk_nope_head_dim"] = d.qk_nope_head_dim;
  j["qk_rope_head_dim"] = d.qk_rope_head_dim;
  j["v_head_dim"] = d.v_head_dim;
  j["head_dim"] = d.qk_rope_head_dim;
  j["n_shared_experts"] = d.n_shared_experts;
  j["n_group"] = d.n_group;
  j["topk_group"] = d.topk_group;
  j["routed_scaling_factor"] = d.routed_scaling_factor;
  j["first_k_dense_replace"] = d.first_k_dense_replace;
  j["rope_interleave"] = d.rope_interleave;
  j.erase("router_aux_loss_coef");
  j.erase("decoder_sparse_step");
  j.erase("mlp_only_layers");
  j["aux_loss_alpha"] = moe_config(m).router_aux_loss_coef;
  j["seq_aux"] = true;
  j["num_nextn_predict_layers"] = 0;  // no multi-token-prediction layers
}

}  // namespace

Routing route_grouped_sigmoid(const torch::Tensor& router_logits, const torch::Tensor& bias,
                              int64_t top_k, int64_t n_group, int64_t topk_group,
                              bool norm_topk_prob, double routed_scaling_factor) {
  const int64_t tokens = router_logits.size(0), experts = router_logits.size(1);
  Routing r;
  r.scores = router_logits.to(torch::kFloat32).sigmoid();
  torch::Tensor choice = r.scores + bias;
  {
    torch::NoGradGuard no_grad;  // the choice is not differentiable (HF: topk indices)
    choice = choice.detach();
    const auto group_scores =
        std::get<0>(choice.view({tokens, n_group, experts / n_group}).topk(2, -1)).sum(-1);
    const auto groups = std::get<1>(group_scores.topk(topk_group, -1));
    const auto keep = torch::zeros_like(group_scores).scatter_(1, groups, 1.0);
    const auto expert_keep =
        keep.unsqueeze(-1).expand({tokens, n_group, experts / n_group}).reshape({tokens, experts});
    choice = choice.masked_fill(expert_keep.logical_not(), -std::numeric_limits<float>::infinity());
    r.indices = std::get<1>(choice.topk(top_k, -1));
  }
  r.weights = r.scores.gather(1, r.indices);
  if (norm_topk_prob) r.weights = r.weights / (r.weights.sum(-1, /*keepdim=*/true) + 1e-20);
  r.weights = r.weights * routed_scaling_factor;
  return r;
}

torch::Tensor sequence_balance_loss(const torch::Tensor& scores, const torch::Tensor& indices,
                                    int64_t batch, ContextParallelHooks* cp) {
  const int64_t experts = scores.size(1), top_k = indices.size(1);
  const auto per_seq = scores.view({batch, -1, experts});
  const int64_t local = per_seq.size(1);
  // s' = s / sum_e s, summed over each sequence's tokens; the choices counted per sequence.
  auto probs = (per_seq / per_seq.sum(-1, /*keepdim=*/true)).sum(1);  // [B, E]
  auto counts = torch::zeros({batch, experts}, scores.options())
                    .scatter_add_(1, indices.view({batch, local * top_k}),
                                  torch::ones({batch, local * top_k}, scores.options()));
  int64_t tokens = local;
  if (cp != nullptr) {
    const auto sums = cp->all_reduce_sum(torch::stack({counts, probs}));
    counts = sums[0];
    probs = sums[1];
    tokens = local * cp->cp_size();
  }
  const auto f = counts * (double(experts) / double(top_k * tokens));
  const auto p = probs / double(tokens);
  return (f * p).sum(-1).mean();
}

std::shared_ptr<CausalLM> make_deepseek_v3(const ModelConfig& config, uint64_t seed) {
  validate(config);
  return std::make_shared<DeepseekV3ForCausalLM>(config, seed);
}

ModelEntry deepseek_v3_entry() {
  ModelSection section;
  section.name = "deepseek_v3";
  section.own_keys = {
      "model.intermediate_size",   "model.moe_intermediate_size", "model.num_experts",
      "model.num_experts_per_tok", "model.router_aux_loss_coef",  "model.norm_topk_prob",
      "model.attention_bias",      "model.q_lora_rank",           "model.kv_lora_rank",
      "model.qk_nope_head_dim",    "model.qk_rope_head_dim",      "model.v_head_dim",
      "model.rope_interleave",     "model.n_shared_experts",      "model.n_group",
      "model.topk_group",          "model.routed_scaling_factor", "model.first_k_dense_replace",
      "model.bias_update_speed"};
  section.check = check_section;
  section.routed_experts = [](const ModelConfig& m) { return moe_config(m).num_experts; };
  // Beyond the heads and the vocabulary: the dense layers' and the shared experts' widths.
  section.tp_split_sizes = [](const ModelConfig& m) {
    std::vector<std::pair<std::string, int64_t>> sizes = {
        {"model.moe_intermediate_size",
         moe_config(m).moe_intermediate_size * deepseek_v3_config(m).n_shared_experts}};
    if (deepseek_v3_config(m).first_k_dense_replace > 0) {
      sizes.emplace_back("model.intermediate_size", m.intermediate_size);
    }
    return sizes;
  };
  HfFamily hf;
  hf.architecture = "DeepseekV3ForCausalLM";
  hf.moe = true;
  hf.attention_bias_field = "attention_bias";
  hf.experts_field = "n_routed_experts";
  hf.writes_sliding_window = false;
  hf.head_dim_default_field = "qk_rope_head_dim";
  hf.float32_suffixes = {".mlp.gate.weight", ".mlp.gate.e_score_correction_bias"};
  hf.read_own = read_hf_fields;
  hf.write_own = write_hf_fields;
  return {"deepseek_v3", make_deepseek_v3, section, hf};
}

}  // namespace mixtrain::deepseek_v3
