#include "mixtrain/model/qwen2_moe.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/model/attention.h"

namespace mixtrain::qwen2_moe {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// How a module reaches its parameters: through the model's materializer (causal_lm.h), under
// their fully qualified names. No materializer: the parameter itself.
struct ParamAccess {
  std::shared_ptr<std::shared_ptr<ParameterMaterializer>> slot;
  std::string prefix;  // e.g. "model.layers.0.self_attn.q_proj."

  ParamAccess child(const std::string& name) const { return {slot, prefix + name + "."}; }
  torch::Tensor unshard(const std::string& local_name, const torch::Tensor& param) const {
    const auto& m = *slot;
    return m ? m->unshard(prefix + local_name, param) : param;
  }
  torch::Tensor post_forward(const std::vector<std::string>& local_names,
                             const torch::Tensor& output) const {
    const auto& m = *slot;
    if (!m) return output;
    std::vector<std::string> names;
    names.reserve(local_names.size());
    for (const auto& n : local_names) names.push_back(prefix + n);
    return m->post_forward(names, output);
  }
  ExpertDispatcher* expert_dispatcher() const {
    const auto& m = *slot;
    return m ? m->expert_dispatcher() : nullptr;
  }
};

// Parameters are registered directly (not through torch::nn::Linear/Embedding) because those
// initialise themselves from the global RNG in their constructors; ours are filled once, from
// the seed, by init_weights().
class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, ParamAccess access)
      : access_(std::move(access)) {
    weight = register_parameter("weight", torch::empty({out_features, in_features}));
    if (bias) this->bias = register_parameter("bias", torch::empty({out_features}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (!bias.defined()) {
      return access_.post_forward({"weight"}, at::linear(x, access_.unshard("weight", weight)));
    }
    return access_.post_forward({"weight", "bias"}, at::linear(x, access_.unshard("weight", weight),
                                                               access_.unshard("bias", bias)));
  }

  torch::Tensor weight;
  torch::Tensor bias;  // undefined when the layer has none

 private:
  ParamAccess access_;
};

class Embedding : public torch::nn::Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, ParamAccess access)
      : access_(std::move(access)) {
    weight = register_parameter("weight", torch::empty({num_embeddings, embedding_dim}));
  }
  torch::Tensor forward(const torch::Tensor& input_ids) {
    return access_.post_forward({"weight"},
                                at::embedding(access_.unshard("weight", weight), input_ids));
  }

  torch::Tensor weight;

 private:
  ParamAccess access_;
};

// HF Qwen2MoeRMSNorm: normalise in float32 (bf16 has too few mantissa bits for the mean of
// squares), cast back, then scale in the compute dtype.
class RMSNorm : public torch::nn::Module {
 public:
  RMSNorm(int64_t hidden_size, double eps, ParamAccess access)
      : eps_(eps), access_(std::move(access)) {
    weight = register_parameter("weight", torch::empty({hidden_size}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto input_dtype = x.scalar_type();
    auto h = x.to(torch::kFloat32);
    const auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
    h = h * torch::rsqrt(variance + eps_);
    return access_.post_forward({"weight"}, access_.unshard("weight", weight) * h.to(input_dtype));
  }

  torch::Tensor weight;

 private:
  double eps_;
  ParamAccess access_;
};

class Qwen2MoeAttention : public torch::nn::Module {
 public:
  Qwen2MoeAttention(const ModelConfig& c, const ParamAccess& access)
      : num_heads_(c.num_heads), num_key_value_heads_(c.num_kv_heads), head_dim_(c.head_dim) {
    q_proj =
        register_module("q_proj", std::make_shared<Linear>(c.hidden_size, c.num_heads * c.head_dim,
                                                           true, access.child("q_proj")));
    k_proj = register_module(
        "k_proj", std::make_shared<Linear>(c.hidden_size, c.num_kv_heads * c.head_dim, true,
                                           access.child("k_proj")));
    v_proj = register_module(
        "v_proj", std::make_shared<Linear>(c.hidden_size, c.num_kv_heads * c.head_dim, true,
                                           access.child("v_proj")));
    o_proj =
        register_module("o_proj", std::make_shared<Linear>(c.num_heads * c.head_dim, c.hidden_size,
                                                           false, access.child("o_proj")));
  }

  // x [B, S, H]; cos/sin [S, D] float32.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
    const int64_t bsz = x.size(0), q_len = x.size(1);
    auto query = q_proj->forward(x).view({bsz, q_len, num_heads_, head_dim_}).transpose(1, 2);
    auto key =
        k_proj->forward(x).view({bsz, q_len, num_key_value_heads_, head_dim_}).transpose(1, 2);
    auto value =
        v_proj->forward(x).view({bsz, q_len, num_key_value_heads_, head_dim_}).transpose(1, 2);
    query = apply_rotary_pos_emb(query, cos, sin);
    key = apply_rotary_pos_emb(key, cos, sin);
    // LibTorch's flash kernel in float32, HF's eager one in bf16/fp16, where flash's backward
    // makes forward + backward up to 3.1x slower on this CPU (bench/README.md, attention_bench).
    auto attn_output =
        causal_attention(query, key, value, attention_kernel_for(query.scalar_type()));
    attn_output = attn_output.transpose(1, 2).reshape({bsz, q_len, num_heads_ * head_dim_});
    return o_proj->forward(attn_output);
  }

  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;

 private:
  int64_t num_heads_, num_key_value_heads_, head_dim_;
};

// SwiGLU MLP: down(silu(gate x) * up x). Used for the shared expert.
class Qwen2MoeMLP : public torch::nn::Module {
 public:
  Qwen2MoeMLP(int64_t hidden_size, int64_t intermediate_size, const ParamAccess& access) {
    gate_proj = register_module(
        "gate_proj",
        std::make_shared<Linear>(hidden_size, intermediate_size, false, access.child("gate_proj")));
    up_proj = register_module("up_proj", std::make_shared<Linear>(hidden_size, intermediate_size,
                                                                  false, access.child("up_proj")));
    down_proj = register_module(
        "down_proj",
        std::make_shared<Linear>(intermediate_size, hidden_size, false, access.child("down_proj")));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return down_proj->forward(torch::silu(gate_proj->forward(x)) * up_proj->forward(x));
  }

  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

// All routed experts as three 3-D parameters [E, out, in]; expert e is the SwiGLU MLP made of
// slice e of each.
class Qwen2MoeExperts : public torch::nn::Module {
 public:
  Qwen2MoeExperts(int64_t num_experts, int64_t hidden_size, int64_t intermediate_size,
                  ParamAccess access)
      : num_experts_(num_experts), access_(std::move(access)) {
    gate_proj = register_parameter("gate_proj",
                                   torch::empty({num_experts, intermediate_size, hidden_size}));
    up_proj =
        register_parameter("up_proj", torch::empty({num_experts, intermediate_size, hidden_size}));
    down_proj = register_parameter("down_proj",
                                   torch::empty({num_experts, hidden_size, intermediate_size}));
  }

  // hidden [T, H]; selected_experts and routing_weights [T, top_k]. Sparse dispatch: the (token,
  // slot) pairs are sorted by expert once, then each expert gathers only its tokens, computes,
  // and scatter-adds its weighted output; no expert ever sees a token not routed to it.
  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& selected_experts,
                        const torch::Tensor& routing_weights) {
    ExpertDispatcher* dispatcher = access_.expert_dispatcher();
    if (dispatcher != nullptr && dispatcher->ep_size() > 1) {
      return forward_expert_parallel(*dispatcher, hidden, selected_experts, routing_weights);
    }
    const int64_t top_k = selected_experts.size(1);
    const auto flat_experts = selected_experts.reshape({-1});
    // Stable sort keeps tokens in order within an expert, so index_add_ order (and the bits of
    // the result) do not depend on the sort implementation.
    const auto order =
        std::get<1>(flat_experts.sort(/*stable=*/c10::optional<bool>(true), /*dim=*/0));
    const auto counts = torch::bincount(flat_experts, {}, num_experts_).to(torch::kCPU);
    const auto token_index = order.div(top_k, "floor");
    const auto slot_weights = routing_weights.reshape({-1}).index_select(0, order);

    // unbind: one backward node that stacks the per-expert gradients, instead of one full-size
    // zero-padded gradient per select.
    const auto gate = access_.unshard("gate_proj", gate_proj).unbind(0);
    const auto up = access_.unshard("up_proj", up_proj).unbind(0);
    const auto down = access_.unshard("down_proj", down_proj).unbind(0);
    auto final_hidden = torch::zeros_like(hidden);
    const auto* count = counts.data_ptr<int64_t>();
    int64_t offset = 0;
    for (int64_t e = 0; e < num_experts_; ++e) {
      const int64_t n = count[e];
      if (n == 0) continue;
      const auto idx = token_index.narrow(0, offset, n);
      const auto x = hidden.index_select(0, idx);
      auto y = at::linear(torch::silu(at::linear(x, gate[e])) * at::linear(x, up[e]), down[e]);
      y = y * slot_weights.narrow(0, offset, n).unsqueeze(-1);
      final_hidden.index_add_(0, idx, y);
      offset += n;
    }
    // Every expert's output feeds final_hidden, so a pre-backward gather hooked here runs
    // before any expert's backward.
    return access_.post_forward({"gate_proj", "up_proj", "down_proj"}, final_hidden);
  }

  // Expert parallelism: the parameters hold this rank's E / ep experts only. The (token, slot)
  // rows, sorted by expert as above, go to the ranks owning their experts (token_dispatch),
  // each rank runs its experts on every row it received, the outputs come back
  // (token_combine) in the sorted order and are weighted and added as above. Every rank takes
  // part in both exchanges even when none of its rows leave or arrive, so the collectives (and
  // their backward) line up across the ep group.
  torch::Tensor forward_expert_parallel(ExpertDispatcher& dispatcher, const torch::Tensor& hidden,
                                        const torch::Tensor& selected_experts,
                                        const torch::Tensor& routing_weights) {
    const int64_t top_k = selected_experts.size(1);
    const auto flat_experts = selected_experts.reshape({-1});
    const auto order =
        std::get<1>(flat_experts.sort(/*stable=*/c10::optional<bool>(true), /*dim=*/0));
    const auto counts = torch::bincount(flat_experts, {}, num_experts_).to(torch::kCPU);
    const auto token_index = order.div(top_k, "floor");
    const auto slot_weights = routing_weights.reshape({-1}).index_select(0, order);
    const auto* count = counts.data_ptr<int64_t>();
    const std::vector<int64_t> tokens_per_expert(count, count + num_experts_);

    // One index_select per expert, as in forward(): backward then accumulates the hidden
    // gradient from the same per-expert pieces in the same order, so a rank's gradients match
    // the all-experts-local model bit for bit wherever the expert GEMMs do.
    std::vector<torch::Tensor> rows;
    int64_t begin = 0;
    for (int64_t e = 0; e < num_experts_; ++e) {
      if (count[e] == 0) continue;
      rows.push_back(hidden.index_select(0, token_index.narrow(0, begin, count[e])));
      begin += count[e];
    }
    const DispatchedTokens dispatched =
        dispatcher.token_dispatch(torch::cat(rows, 0), tokens_per_expert);
    // Each expert runs one GEMM per source rank, not one over all its rows: the per-row results
    // of a bfloat16 GEMM may depend on the number of rows (oneDNN's blocking: measured from 16
    // rows on with LibTorch 1.13; not seen with 2.11, but no kernel promises it), and this way
    // every row is computed exactly as the all-experts-local model computes it on the source rank's
    // batch, so the result does not depend on the parallel layout. The weights are materialized
    // once per source for the same reason: each source's weight gradient reaches the materializer
    // on its own and is summed there in float32 (the fp32 main_grad's unrounded sum), instead of
    // being summed in bfloat16 by autograd. The cost is ep smaller GEMMs per expert; the
    // materialization is a cast (no copy in bf16).
    const int64_t ranks = dispatcher.ep_size();
    std::vector<std::vector<torch::Tensor>> gate, up, down;  // [source][local expert]
    for (int64_t src = 0; src < ranks; ++src) {
      gate.push_back(access_.unshard("gate_proj", gate_proj).unbind(0));
      up.push_back(access_.unshard("up_proj", up_proj).unbind(0));
      down.push_back(access_.unshard("down_proj", down_proj).unbind(0));
    }
    // A zero-row view keeps the output connected to the dispatch even when no row arrived.
    std::vector<torch::Tensor> outputs{dispatched.tokens.narrow(0, 0, 0)};
    int64_t offset = 0;
    for (size_t e = 0; e < dispatched.tokens_per_expert.size(); ++e) {
      for (int64_t src = 0; src < ranks; ++src) {
        const int64_t n = dispatched.tokens_per_expert_and_source[e * ranks + src];
        if (n == 0) continue;
        const auto x = dispatched.tokens.narrow(0, offset, n);
        outputs.push_back(at::linear(
            torch::silu(at::linear(x, gate[src][e])) * at::linear(x, up[src][e]), down[src][e]));
        offset += n;
      }
    }
    const auto combined = dispatcher.token_combine(torch::cat(outputs, 0), dispatched);
    // One index_add_ per expert, as in forward(): LibTorch 2.x's CPU index_add_ sums a row's
    // repeated indices of one call in float32 and rounds once, while forward() rounds to
    // bfloat16 after each expert; with 3 or more experts per token the two differ by bf16 ulps.
    const auto weighted =
        (combined * slot_weights.unsqueeze(-1)).split_with_sizes(tokens_per_expert);
    const auto indices = token_index.split_with_sizes(tokens_per_expert);
    auto final_hidden = torch::zeros_like(hidden);
    for (int64_t e = 0; e < num_experts_; ++e) {
      if (count[e] > 0) final_hidden.index_add_(0, indices[e], weighted[e]);
    }
    return access_.post_forward({"gate_proj", "up_proj", "down_proj"}, final_hidden);
  }

  torch::Tensor gate_proj, up_proj, down_proj;

 private:
  int64_t num_experts_;
  ParamAccess access_;
};

class Qwen2MoeSparseMoeBlock : public torch::nn::Module {
 public:
  Qwen2MoeSparseMoeBlock(const ModelConfig& c, const ParamAccess& access)
      : top_k_(c.num_experts_per_tok) {
    gate = register_module("gate", std::make_shared<Linear>(c.hidden_size, c.num_experts, false,
                                                            access.child("gate")));
    experts = register_module("experts", std::make_shared<Qwen2MoeExperts>(
                                             c.num_experts, c.hidden_size, c.moe_intermediate_size,
                                             access.child("experts")));
    shared_expert = register_module(
        "shared_expert",
        std::make_shared<Qwen2MoeMLP>(c.hidden_size, c.shared_expert_intermediate_size,
                                      access.child("shared_expert")));
    shared_expert_gate = register_module(
        "shared_expert_gate",
        std::make_shared<Linear>(c.hidden_size, 1, false, access.child("shared_expert_gate")));
  }

  // x [B, S, H] -> ([B, S, H], router_logits [B*S, E] in the compute dtype).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    const auto hidden = x.reshape({-1, x.size(-1)});
    auto router_logits = gate->forward(hidden);
    const auto probs = torch::softmax(router_logits, 1, torch::kFloat32);
    auto [routing_weights, selected_experts] = probs.topk(top_k_, -1);
    // norm_topk_prob = false: the top-k probabilities are used as they are.
    routing_weights = routing_weights.to(hidden.scalar_type());
    auto out = experts->forward(hidden, selected_experts, routing_weights);
    out =
        out + torch::sigmoid(shared_expert_gate->forward(hidden)) * shared_expert->forward(hidden);
    return {out.view(x.sizes()), router_logits};
  }

  std::shared_ptr<Linear> gate;
  std::shared_ptr<Qwen2MoeExperts> experts;
  std::shared_ptr<Qwen2MoeMLP> shared_expert;
  std::shared_ptr<Linear> shared_expert_gate;

 private:
  int64_t top_k_;
};

class Qwen2MoeDecoderLayer : public torch::nn::Module {
 public:
  Qwen2MoeDecoderLayer(const ModelConfig& c, const ParamAccess& access) {
    // Registration order = HF's, so named_parameters() lists in state_dict order.
    self_attn = register_module("self_attn",
                                std::make_shared<Qwen2MoeAttention>(c, access.child("self_attn")));
    mlp = register_module("mlp", std::make_shared<Qwen2MoeSparseMoeBlock>(c, access.child("mlp")));
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

  std::shared_ptr<Qwen2MoeAttention> self_attn;
  std::shared_ptr<Qwen2MoeSparseMoeBlock> mlp;
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
};

class Qwen2MoeModel : public torch::nn::Module {
 public:
  Qwen2MoeModel(const ModelConfig& c, const ParamAccess& access) : config_(c) {
    embed_tokens = register_module(
        "embed_tokens",
        std::make_shared<Embedding>(c.vocab_size, c.hidden_size, access.child("embed_tokens")));
    auto list = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_layers; ++i) {
      layers.push_back(
          std::make_shared<Qwen2MoeDecoderLayer>(c, access.child("layers." + std::to_string(i))));
      list->push_back(layers.back());
    }
    norm = register_module(
        "norm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, access.child("norm")));
  }

  // -> (final hidden states [B, S, H], router logits of every layer)
  std::pair<torch::Tensor, std::vector<torch::Tensor>> forward(const torch::Tensor& input_ids) {
    const int64_t seq_len = input_ids.size(1);
    auto [cos, sin] = rotary_cos_sin(seq_len, config_.head_dim, config_.rope_theta);
    auto h = embed_tokens->forward(input_ids);
    std::vector<torch::Tensor> router_logits;
    router_logits.reserve(layers.size());
    for (auto& layer : layers) {
      auto [out, logits] = layer->forward(h, cos, sin);
      h = out;
      router_logits.push_back(logits);
    }
    return {norm->forward(h), std::move(router_logits)};
  }

  std::shared_ptr<Embedding> embed_tokens;
  std::vector<std::shared_ptr<Qwen2MoeDecoderLayer>> layers;  // registered as "layers.N"
  std::shared_ptr<RMSNorm> norm;

 private:
  ModelConfig config_;
};

class Qwen2MoeForCausalLM : public CausalLM {
 public:
  Qwen2MoeForCausalLM(const ModelConfig& c, uint64_t seed) : config_(c) {
    const ParamAccess root{materializer_slot(), ""};
    model = register_module("model", std::make_shared<Qwen2MoeModel>(c, root.child("model")));
    lm_head = register_module("lm_head", std::make_shared<Linear>(c.hidden_size, c.vocab_size,
                                                                  false, root.child("lm_head")));
    init_weights(seed);
  }

  CausalLMOutput forward(const torch::Tensor& input_ids) override {
    TORCH_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == torch::kInt64,
                "qwen2_moe: input_ids must be int64 [batch, seq], got ", input_ids.scalar_type(),
                " ", input_ids.sizes());
    TORCH_CHECK(input_ids.size(1) <= config_.max_seq_len, "qwen2_moe: sequence length ",
                input_ids.size(1), " exceeds model.max_seq_len ", config_.max_seq_len);
    const auto& materializer = parameter_materializer();
    auto [hidden, router_logits] =
        model->forward(materializer ? materializer->cast_forward_input(input_ids) : input_ids);
    CausalLMOutput out;
    out.logits = lm_head->forward(hidden);
    // Only the logits take output_dtype: the aux loss stays float32 (contract above).
    if (materializer) out.logits = materializer->cast_forward_output(out.logits);
    out.aux_loss =
        load_balancing_loss(router_logits, config_.num_experts, config_.num_experts_per_tok);
    return out;
  }

  const ModelConfig& config() const override { return config_; }

  std::shared_ptr<Qwen2MoeModel> model;
  std::shared_ptr<Linear> lm_head;

 private:
  // HF _init_weights with initializer_range 0.02, drawn in named_parameters() order from a local
  // generator: reproducible from the seed alone, and the global RNG stays untouched.
  void init_weights(uint64_t seed) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    torch::NoGradGuard no_grad;
    for (auto& item : named_parameters(/*recurse=*/true)) {
      auto& p = item.value();
      if (ends_with(item.key(), ".bias")) {
        p.zero_();
      } else if (ends_with(item.key(), "norm.weight")) {
        p.fill_(1.0);
      } else {
        p.normal_(0.0, 0.02, generator);
      }
    }
  }

  ModelConfig config_;
};

void require(bool ok, const std::string& key, const std::string& what) {
  if (!ok) throw ConfigError("model." + key + ": " + what);
}

void validate(const ModelConfig& c) {
  require(c.vocab_size > 0, "vocab_size", "must be > 0");
  require(c.hidden_size > 0, "hidden_size", "must be > 0");
  require(c.num_layers > 0, "num_layers", "must be > 0");
  require(c.num_heads > 0, "num_heads", "must be > 0");
  require(c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0, "num_kv_heads",
          "must be > 0 and divide model.num_heads (" + std::to_string(c.num_heads) + "), got " +
              std::to_string(c.num_kv_heads));
  require(
      c.head_dim > 0 && c.head_dim % 2 == 0, "head_dim",
      "must be even and > 0 (rotary embeddings rotate pairs), got " + std::to_string(c.head_dim));
  require(c.moe_intermediate_size > 0, "moe_intermediate_size", "must be > 0");
  require(c.num_experts > 0, "num_experts", "must be > 0");
  require(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_experts,
          "num_experts_per_tok",
          "must be in [1, model.num_experts = " + std::to_string(c.num_experts) + "], got " +
              std::to_string(c.num_experts_per_tok));
  require(c.shared_expert_intermediate_size > 0, "shared_expert_intermediate_size", "must be > 0");
  require(c.max_seq_len > 0, "max_seq_len", "must be > 0");
  require(c.rope_theta > 0, "rope_theta", "must be > 0");
  require(c.rms_norm_eps > 0, "rms_norm_eps", "must be > 0");
}

}  // namespace

std::shared_ptr<CausalLM> make_qwen2_moe(const ModelConfig& config, uint64_t seed) {
  validate(config);
  return std::make_shared<Qwen2MoeForCausalLM>(config, seed);
}

torch::Tensor load_balancing_loss(const std::vector<torch::Tensor>& router_logits,
                                  int64_t num_experts, int64_t top_k) {
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
  const auto tokens_per_expert = expert_mask.mean(0);
  const auto router_prob_per_expert = routing_weights.mean(0);
  return (tokens_per_expert * router_prob_per_expert).sum() * double(num_experts);
}

std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(int64_t seq_len, int64_t head_dim,
                                                       double rope_theta) {
  // float32 throughout, as HF (which disables autocast for this): bf16 angles would be wrong by
  // whole radians at long positions.
  const auto exponents = torch::arange(0, head_dim, 2, torch::kInt64).to(torch::kFloat32) /
                         static_cast<float>(head_dim);
  const auto inv_freq = 1.0 / torch::pow(rope_theta, exponents);
  const auto positions = torch::arange(seq_len, torch::kInt64).to(torch::kFloat32);
  const auto freqs = torch::outer(positions, inv_freq);
  const auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

torch::Tensor apply_rotary_pos_emb(const torch::Tensor& x, const torch::Tensor& cos,
                                   const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.to(x.scalar_type()) + rotated * sin.to(x.scalar_type());
}

}  // namespace mixtrain::qwen2_moe
