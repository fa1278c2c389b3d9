// The building blocks the Qwen2-family models share (qwen2.cpp, qwen2_moe.cpp), with Hugging
// Face's parameter names and numerics:
//   ParamAccess   how a module reads its parameters: through the CausalLM materializer
//                 (causal_lm.h) under their fully qualified names, or the parameter itself;
//   Linear, Embedding, RMSNorm (float32 normalisation, cast back, then scale), Qwen2Attention
//   (q/k/v and o projections with or without bias, optional per-head q/k RMSNorm, rotary,
//   causal GQA: attention.h), SwiGLUMLP
//   (down(silu(gate x) * up x));
//   rotary_cos_sin / apply_rotary_pos_emb (HF layout, float32 tables);
//   init_hf_weights (HF _init_weights with initializer_range 0.02, from a seed);
//   Qwen2FamilyForCausalLM (the wrapper around a decoder stack: lm_head, input checks, roles).
// Parameters are registered directly (not through torch::nn::Linear/Embedding), because those
// initialise themselves from the global RNG in their constructors; ours are filled once, from
// the seed, by init_hf_weights. Each module reports its output to post_forward once its
// forward has made its last use of its parameters (the materializer contract).
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/model/causal_lm.h"

namespace mixtrain {

struct ParamAccess {
  std::shared_ptr<std::shared_ptr<ParameterMaterializer>> slot;
  std::string prefix;  // e.g. "model.layers.0.self_attn.q_proj."
  // The model's QK-clip recorder slot (CausalLM::set_max_logit_recorder); may be null.
  std::shared_ptr<std::shared_ptr<MaxLogitRecorder>> recorder_slot = nullptr;

  ParamAccess child(const std::string& name) const {
    return {slot, prefix + name + ".", recorder_slot};
  }
  torch::Tensor unshard(const std::string& local_name, const torch::Tensor& param) const;
  torch::Tensor post_forward(const std::vector<std::string>& local_names,
                             const torch::Tensor& output) const;
  ExpertDispatcher* expert_dispatcher() const;
  TensorParallelHooks* tensor_parallel() const;    // nullptr without tensor parallelism
  ContextParallelHooks* context_parallel() const;  // nullptr without context parallelism
  MaxLogitRecorder* max_logit_recorder() const;    // nullptr unless QK-clip records
};

// A layer whose parameters are `weight` (registered first, left uninitialised for
// init_hf_weights) and possibly more, each read through access_.
class WeightedLayer : public torch::nn::Module {
 public:
  torch::Tensor weight;

 protected:
  WeightedLayer(at::IntArrayRef weight_shape, ParamAccess access);
  ParamAccess access_;
};

// How a linear layer splits over tensor parallelism (causal_lm.h TensorParallelHooks), used only
// when the materializer has tp hooks (without, every style computes x W^T + b as it always did):
//   kColumn  weight/bias hold rows (output features) [t*out/tp, (t+1)*out/tp); the caller passes
//            the input through copy_to_tp once per block (tp_block_input), so the column layers
//            that read it (q/k/v, gate/up) sum their input gradients over tp once, as Megatron's
//            fused QKV does; output: this rank's feature slice;
//   kRow     weight holds those columns (input features); input: this rank's feature slice;
//            output = reduce_from_tp(x W_local^T) + bias (bias whole on every rank, added once);
//   kNone    whole on every tp rank.
// The model declares the same split with CausalLM::assign_tp_dim (0 column, 1 row weight).
enum class TpStyle { kNone, kColumn, kRow };

// A block's input to its column-parallel layers: copy_to_tp(x) with tp hooks, else x itself.
torch::Tensor tp_block_input(const ParamAccess& access, const torch::Tensor& x);

class Linear : public WeightedLayer {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, ParamAccess access,
         TpStyle tp_style = TpStyle::kNone);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor bias;  // undefined when the layer has none

 private:
  TpStyle tp_style_;
};

// With tp hooks, vocabulary-parallel: the table holds rows [t*V/tp, (t+1)*V/tp); ids outside
// them give zero rows; the rows found are summed over tp (reduce_from_tp).
class Embedding : public WeightedLayer {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, ParamAccess access);
  torch::Tensor forward(const torch::Tensor& input_ids);
  // The tied output head (tie_word_embeddings): hidden W^T with this table as W, column-parallel
  // under tp (hidden came through tp_block_input; the logits are this rank's vocabulary rows,
  // the same rows the lookup holds). The table is materialized again for this use, so its
  // gradient gets both uses' contributions, each reduced once.
  torch::Tensor attend(const torch::Tensor& hidden);
};

// HF Qwen2RMSNorm: normalise in float32 (bf16 has too few mantissa bits for the mean of
// squares), cast back, then scale in the compute dtype. tp_local_heads (q_norm / k_norm): under
// tensor parallelism the norm, whole on every tp rank, scales only this rank's heads, so its
// weight's gradient is summed over tp (copy_to_tp on the weight) and every tp rank gets the
// whole model's gradient.
class RMSNorm : public WeightedLayer {
 public:
  RMSNorm(int64_t hidden_size, double eps, ParamAccess access, bool tp_local_heads = false);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  double eps_;
  bool tp_local_heads_;
};

// What distinguishes the families' attention (HF): Qwen2 / Qwen2-MoE bias q/k/v only (Qwen2
// always, Qwen2-MoE per qkv_bias); Llama and Qwen3-MoE bias q/k/v and o alike per
// attention_bias; Qwen3-MoE RMS-normalises each head of q and k over head_dim before rotary.
struct AttentionOptions {
  bool qkv_bias = true;
  bool o_bias = false;
  bool qk_norm = false;  // registers self_attn.q_norm / k_norm, weight [head_dim]
  // Sliding-window causal attention (HF Mistral): each position attends to the last
  // sliding_window keys, itself included (attention.h); 0: every earlier key. Context
  // parallelism's ring has no window: the forward refuses the combination (validation first).
  int64_t sliding_window = 0;
};

// HF Qwen2Attention / LlamaAttention / Qwen3MoeAttention (eval, no cache): q/k/v projections,
// [q_norm, k_norm per head,] rotary on q and k, causal grouped-query attention with the kernel
// attention_kernel_for(compute dtype), o projection. With a MaxLogitRecorder installed, the
// heads' max logits (after rotary, over the whole sequence under context parallelism) are
// recorded under this module's prefix at the rank's global head indices. Registration order is
// HF's: q, k, v, o, q_norm, k_norm. Tensor parallelism: q/k/v column-, o row-parallel, so a rank
// computes num_heads/tp query and num_kv_heads/tp kv heads (query head h still reads kv head h /
// (num_heads / num_kv_heads)); q/k norms whole, their weight gradients summed over tp (RMSNorm
// tp_local_heads).
class Qwen2Attention : public torch::nn::Module {
 public:
  Qwen2Attention(const ModelConfig& c, const ParamAccess& access, const AttentionOptions& options);
  // x [B, S, H]; cos/sin [S, D] float32.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<RMSNorm> q_norm, k_norm;  // null unless options.qk_norm

 private:
  int64_t num_heads_, num_key_value_heads_, head_dim_;  // the model's (all tp ranks')
  int64_t sliding_window_;
  ParamAccess access_;
};

// SwiGLU MLP without biases: down(silu(gate x) * up x) (HF Qwen2MLP; Qwen2-MoE's shared expert).
// Tensor parallelism: gate/up column-, down row-parallel.
class SwiGLUMLP : public torch::nn::Module {
 public:
  SwiGLUMLP(int64_t hidden_size, int64_t intermediate_size, const ParamAccess& access);
  torch::Tensor forward(const torch::Tensor& x);

  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;

 private:
  ParamAccess access_;
};

// Rotary inverse frequencies [head_dim / 2], float32: inv_freq_i = theta^(-2i/head_dim), then,
// with model.rope_scaling llama3, Llama 3.1's adjustment (HF _compute_llama3_parameters), with
// wavelen = 2 pi / inv_freq and L = rope_original_max_seq_len:
//   wavelen < L / high_freq_factor: inv_freq;  wavelen > L / low_freq_factor: inv_freq / factor;
//   between: (1 - s) inv_freq / factor + s inv_freq,
//   s = (L / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor).
// With model.rope_scaling yarn, YaRN's frequencies (HF _compute_yarn_parameters): with
// d = head_dim, L = rope_original_max_seq_len, the correction dims r(b) = d ln(L / (2 pi b)) /
// (2 ln theta), low = max(floor(r(beta_fast)), 0), high = min(ceil(r(beta_slow)), d - 1), ramp_i =
// clamp((i - low) / (high - low), 0, 1): inv_freq_i (1 - ramp_i) + inv_freq_i / factor ramp_i.
// The same float32 tensor ops as HF, so the tables agree to float32 rounding.
torch::Tensor rotary_inv_freq(const ModelConfig& c);

// YaRN's attention factor, by which the rotary tables' cos and sin are multiplied (HF
// _compute_yarn_parameters): with mscale and mscale_all_dim both given, m(factor, mscale) /
// m(factor, mscale_all_dim), else m(factor, 1), where m(s, x) = 0.1 x ln(s) + 1 for s > 1 (1
// otherwise); 1 for the other schemes.
double rope_attention_factor(const ModelConfig& c);
double yarn_mscale(double scale, double mscale);

// Rotary tables for positions 0..seq_len-1, float32 [seq_len, head_dim], HF layout:
// angle = pos * inv_freq, both halves repeat the angles. Computed on the CPU and placed on
// `device`: every device gets bitwise the same tables. The (head_dim, rope_theta) form is the
// unscaled one.
std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(int64_t seq_len, const ModelConfig& c,
                                                       torch::Device device = torch::kCPU);
std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(int64_t seq_len, int64_t head_dim,
                                                       double rope_theta,
                                                       torch::Device device = torch::kCPU);

// The decoder's rotary tables for input_ids [B, S]: positions 0..S-1, or with context
// parallelism (access.context_parallel()) the global positions of this rank's tokens, as rows of
// the whole sequence's tables (so every position gets the single-process bits).
std::pair<torch::Tensor, torch::Tensor> decoder_rotary(const torch::Tensor& input_ids,
                                                       const ModelConfig& c,
                                                       const ParamAccess& access);

// decoder_rotary's tables, built once per (sequence length, device, context-parallel hooks) and
// kept: built on every forward, a GPU run would copy them from pageable host memory each time,
// one host synchronisation each. The tables are never modified in place by their users.
class RotaryTables {
 public:
  std::pair<torch::Tensor, torch::Tensor> operator()(const torch::Tensor& input_ids,
                                                     const ModelConfig& c,
                                                     const ParamAccess& access);

 private:
  struct Entry {
    int64_t seq_len;
    torch::Device device;
    const void* cp;  // the hooks the positions came from (null: none)
    std::pair<torch::Tensor, torch::Tensor> tables;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
};

// x W^T (+ b) for x [..., in], W [out, in], b [out] or undefined: at::linear's arithmetic (the
// leading dims folded into one mm, or addmm with a bias, as linear and matmul fold a
// contiguous input) in fewer dispatched ops (no linear/matmul/reshape layers and their views in
// forward and backward; docs/architecture.md §3 on op counts). Other inputs go to at::linear.
torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& weight,
                    const torch::Tensor& bias = {});

// x * cos + rotate_half(x) * sin for x [batch, heads, seq, head_dim]; cos/sin [seq, head_dim]
// are cast to x's dtype (as HF).
torch::Tensor apply_rotary_pos_emb(const torch::Tensor& x, const torch::Tensor& cos,
                                   const torch::Tensor& sin);

// DeepSeek's interleaved rotary layout (HF apply_rotary_pos_emb_interleave): x's last dim holds
// pairs (x0, x1), (x2, x3), ..., pair i rotated by the angle of cos/sin's column i (the tables'
// first half, rotary_cos_sin's layout); the result lists every pair's first element, then every
// pair's second ([x0 c - x1 s, x2 c - x3 s, ..., x1 c + x0 s, ...]), as HF: q and k get the same
// layout, so their dot products are the pairs'. cos/sin are cast to x's dtype first.
torch::Tensor apply_rotary_pos_emb_interleaved(const torch::Tensor& x, const torch::Tensor& cos,
                                               const torch::Tensor& sin);

// HF _init_weights with initializer_range 0.02, drawn in named_parameters() order from a local
// CPU generator seeded with `seed` (reproducible from the seed alone; the global RNG stays
// untouched): zero for names ending in ".bias", ones for names ending in "norm.weight",
// normal(0, 0.02) for everything else.
void init_hf_weights(torch::nn::Module& model, uint64_t seed);

// Throws std::invalid_argument "model config: <field> <what>" unless ok: the models' own shape
// invariants. validate_config refuses each first, naming the key as the user wrote it.
void require_model_key(bool ok, const std::string& key, const std::string& what);

// TORCH_CHECKs that input_ids is int64 [batch, seq] with seq <= max_seq_len; `label` names the
// model in the message.
void check_qwen2_input_ids(const char* label, const torch::Tensor& input_ids, int64_t max_seq_len);

// The checks every Qwen2-family model needs (sizes > 0, GQA divisibility, even head_dim, ...).
void validate_qwen2_common(const ModelConfig& c);

// The causal-LM wrapper every Qwen2-family model shares (HF *ForCausalLM): the decoder stack
// `Model` registered as "model", then lm_head (HF's order, hence named_parameters() order), or,
// with tie_word_embeddings, no lm_head: the head is model.embed_tokens (Embedding::attend), one
// parameter for both uses, as HF ties them; forward's input checks and materializer casts around
// them; the roles of the parts every family member has. Model(config, access, model_args...) has
// embed_tokens, layers (each with self_attn, input_layernorm, post_attention_layernorm) and norm. A
// subclass adds its layers' MLP roles and calls init_hf_weights once the tree is complete.
template <typename Model>
class Qwen2FamilyForCausalLM : public CausalLM {
 public:
  const ModelConfig& config() const override { return config_; }

  std::shared_ptr<Model> model;
  std::shared_ptr<Linear> lm_head;  // null with tie_word_embeddings

 protected:
  // label names the model in forward's errors ("qwen2", "qwen2_moe", ...); model_args go to
  // Model's constructor after (config, access).
  template <typename... ModelArgs>
  Qwen2FamilyForCausalLM(const ModelConfig& c, const char* label, const ModelArgs&... model_args)
      : config_(c), label_(label) {
    const ParamAccess root{materializer_slot(), "", max_logit_recorder_slot()};
    model =
        register_module("model", std::make_shared<Model>(c, root.child("model"), model_args...));
    // Column-parallel under tp: the logits stay split over the vocabulary.
    if (!c.tie_word_embeddings) {
      lm_head = register_module("lm_head",
                                std::make_shared<Linear>(c.hidden_size, c.vocab_size, false,
                                                         root.child("lm_head"), TpStyle::kColumn));
    }
  }

  // input_ids, checked to be int64 [batch, seq] with seq <= max_seq_len, as the stack takes it.
  torch::Tensor model_input(const torch::Tensor& input_ids) const {
    check_qwen2_input_ids(label_, input_ids, config_.max_seq_len);
    const auto& materializer = parameter_materializer();
    return materializer ? materializer->cast_forward_input(input_ids) : input_ids;
  }

  // lm_head(hidden) (tied: embed_tokens.attend(hidden)), in output_dtype where a materializer
  // casts it.
  torch::Tensor logits(const torch::Tensor& hidden) {
    const torch::Tensor input = tp_block_input(ParamAccess{materializer_slot(), ""}, hidden);
    auto out = lm_head ? lm_head->forward(input) : model->embed_tokens->attend(input);
    const auto& materializer = parameter_materializer();
    return materializer ? materializer->cast_forward_output(out) : out;
  }

  ContextParallelHooks* context_parallel() const {
    const auto& materializer = parameter_materializer();
    return materializer ? materializer->context_parallel() : nullptr;
  }

  static std::string layer_prefix(size_t i) { return "model.layers." + std::to_string(i) + "."; }

  // The tensor-parallel split of the parts every family member has (Megatron): the vocabulary
  // of embed_tokens and lm_head, q/k/v (weights and biases) column, o row (its bias whole).
  void assign_common_tp_dims() {
    assign_tp_dim("model.embed_tokens.", *model->embed_tokens, 0);
    for (size_t i = 0; i < model->layers.size(); ++i) {
      const auto& attn = *model->layers[i]->self_attn;
      const std::string p = layer_prefix(i) + "self_attn.";
      assign_tp_dim(p + "q_proj.", *attn.q_proj, 0);
      assign_tp_dim(p + "k_proj.", *attn.k_proj, 0);
      assign_tp_dim(p + "v_proj.", *attn.v_proj, 0);
      assign_tp_dim(p + "o_proj.", *attn.o_proj, 1, /*weight_only=*/true);
    }
    if (lm_head) assign_tp_dim("lm_head.", *lm_head, 0);
  }

  // A SwiGLU MLP under `prefix` (dense MLP, shared expert): gate/up column, down row.
  void assign_mlp_tp_dims(const std::string& prefix, SwiGLUMLP& mlp) {
    assign_tp_dim(prefix + "gate_proj.", *mlp.gate_proj, 0);
    assign_tp_dim(prefix + "up_proj.", *mlp.up_proj, 0);
    assign_tp_dim(prefix + "down_proj.", *mlp.down_proj, 1, /*weight_only=*/true);
  }

  void assign_common_roles() {
    assign_param_role("model.embed_tokens.", *model->embed_tokens, ParamRole::kEmbedding);
    for (size_t i = 0; i < model->layers.size(); ++i) {
      const auto& layer = *model->layers[i];
      const std::string p = layer_prefix(i);
      // Each projection with its layer: the key its max logits are recorded under.
      const std::string attn = p + "self_attn.";
      auto& a = *layer.self_attn;
      assign_param_role(attn + "q_proj.", *a.q_proj, ParamRole::kAttentionQuery, attn);
      assign_param_role(attn + "k_proj.", *a.k_proj, ParamRole::kAttentionKey, attn);
      assign_param_role(attn + "v_proj.", *a.v_proj, ParamRole::kAttentionValue, attn);
      assign_param_role(attn + "o_proj.", *a.o_proj, ParamRole::kAttentionOutput, attn);
      if (layer.self_attn->q_norm) {  // per-head q/k norms: norms, not attention projections
        assign_param_role(p + "self_attn.q_norm.", *layer.self_attn->q_norm, ParamRole::kNorm);
        assign_param_role(p + "self_attn.k_norm.", *layer.self_attn->k_norm, ParamRole::kNorm);
      }
      assign_param_role(p + "input_layernorm.", *layer.input_layernorm, ParamRole::kNorm);
      assign_param_role(p + "post_attention_layernorm.", *layer.post_attention_layernorm,
                        ParamRole::kNorm);
    }
    assign_param_role("model.norm.", *model->norm, ParamRole::kNorm);
    if (lm_head) assign_param_role("lm_head.", *lm_head, ParamRole::kOutputHead);
  }

  ModelConfig config_;

 private:
  const char* label_;
};

}  // namespace mixtrain
