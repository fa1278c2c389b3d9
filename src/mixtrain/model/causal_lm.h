// The model interface the trainer is written against: a causal language model over token ids.
//
// forward() takes int64 input_ids [batch, seq] and returns next-token logits [batch, seq, vocab]
// in the model's compute dtype (the dtype of its parameters) plus the router load-balancing loss
// as a float32 scalar. The loss the trainer minimises is
//   cross_entropy(logits, labels) + config().router_aux_loss_coef * aux_loss;
// the coefficient is applied by the caller, not here, so metrics can report both terms.
// Models without a router return aux_loss = 0.
//
// Parameter roles: the model says what each of its parameters is (param_role), so the layers
// above never guess from name fragments. Expert parallelism splits exactly the kExpert
// tensors, whose expert dim is dim 0 (one routed expert per index: [E, out, in]).
//
// Parameter materialization (docs/architecture.md §7): forward never computes with a parameter
// directly; it asks the installed ParameterMaterializer for the tensor to compute with. Without one
// (the default) that is the parameter itself, so a plain model is unchanged, bit for bit. The
// data-parallel wrappers (distributed/fsdp.h) install one that all-gathers the local shard
// (FSDP) or casts to param_dtype, and routes the gradient back through a reduce-scatter /
// all-reduce into main_grad or .grad.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/core/param_role.h"
#include "mixtrain/model/attention.h"
#include "mixtrain/model/max_logit_recorder.h"

namespace mixtrain {

struct CausalLMOutput {
  torch::Tensor logits;    // [batch, seq, vocab], in the model's compute dtype
  torch::Tensor aux_loss;  // scalar float32, NOT yet multiplied by router_aux_loss_coef
};

// Expert parallelism (distributed/expert_parallel.h): the routed experts are split by expert
// over an ep group of ep_size() ranks; this rank holds experts [ep_rank() * E / ep_size(),
// (ep_rank() + 1) * E / ep_size()) and its expert parameters are that dim-0 slice. A MoE layer
// sorts its (token, slot) rows by global expert, token_dispatch sends each row to the rank that
// owns its expert and returns the rows this rank's experts must process, grouped by local expert;
// token_combine sends the expert outputs back, in the row order token_dispatch was given. Both
// are collective over the ep group and differentiable (the backward is the reverse exchange).
// With a dispatcher a MoE layer calls unshard for each expert tensor once per source rank, so
// each source's expert gradient reaches the materializer on its own (moe_experts.cpp says why).
struct DispatchedTokens {
  torch::Tensor tokens;                    // [rows, H], grouped by local expert
  std::vector<int64_t> tokens_per_expert;  // rows per local expert (E / ep_size entries)
  // The same rows split by source ep rank: [local expert][source rank], E / ep_size x ep_size
  // entries; within an expert the sources come in rank order.
  std::vector<int64_t> tokens_per_expert_and_source;
  // What token_combine needs: rows exchanged with each ep rank, and the permutation from the
  // received (source-rank-major) order to the grouped order.
  std::vector<int64_t> send_counts, recv_counts;
  torch::Tensor grouped_to_received;
};

class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;
  virtual int64_t ep_size() const = 0;
  virtual int64_t ep_rank() const = 0;
  // tokens [rows, H] sorted by global expert, tokens_per_expert[e] rows for expert e (E entries).
  virtual DispatchedTokens token_dispatch(const torch::Tensor& tokens,
                                          const std::vector<int64_t>& tokens_per_expert) = 0;
  // expert_output [rows, H] in the layout of dispatched.tokens -> [input rows, H] in the order
  // of token_dispatch's input.
  virtual torch::Tensor token_combine(const torch::Tensor& expert_output,
                                      const DispatchedTokens& dispatched) = 0;
};

// Tensor parallelism (distributed/tensor_parallel.h; Megatron-LM's layout): a tp group of
// tp_size() ranks computes one model, each holding a slice of the split parameters (the model
// says which: CausalLM::tp_dim). Column-parallel linears (q/k/v, gate/up, lm_head) hold rows
// [tp_rank() * out/tp, (tp_rank()+1) * out/tp) of the weight (and bias) and produce that slice of
// the features; row-parallel ones (o, down) hold the same columns of the weight, consume that
// slice and sum their partial outputs over the group (their bias, whole on every rank, is added
// once, after the sum). The vocabulary-parallel embedding holds rows of the table and sums the
// rows found; lm_head's logits stay split over the vocabulary (cross_entropy never gathers
// them). Every other parameter is whole on every tp rank and sees the same values there.
class TensorParallelHooks {
 public:
  virtual ~TensorParallelHooks() = default;
  virtual int64_t tp_size() const = 0;
  virtual int64_t tp_rank() const = 0;
  // Megatron's f: identity forward; backward sums the gradient over the tp group.
  virtual torch::Tensor copy_to_tp(const torch::Tensor& x) = 0;
  // Megatron's g: forward sums over the tp group (in float32, cast back to x's dtype);
  // identity backward.
  virtual torch::Tensor reduce_from_tp(const torch::Tensor& x) = 0;
  // Per-token cross-entropy -log softmax(logits)[label] of the full-vocabulary logits whose
  // slice [tp_rank() * V/tp, (tp_rank()+1) * V/tp) this rank holds: local_logits [N, V/tp]
  // (float32), labels int64 [N] (global ids) -> float32 [N], the same on every tp rank;
  // differentiable in local_logits. No rank holds the full logits.
  virtual torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& local_logits,
                                                     const torch::Tensor& labels) = 0;
};

// Context parallelism (distributed/context_parallel.h): a cp group of cp_size() ranks shares
// one batch of sequences, each rank holding 2 of its 2 x cp equal chunks along the sequence:
// chunks cp_rank() and 2 cp - 1 - cp_rank(), in that order (causal load balance: every rank gets
// the same attention work). The model's input_ids are those tokens only; positions, attention
// and the router's batch statistics are over the whole sequence.
class ContextParallelHooks {
 public:
  virtual ~ContextParallelHooks() = default;
  virtual int64_t cp_size() const = 0;
  virtual int64_t cp_rank() const = 0;
  // The global positions of this rank's local_seq tokens, int64 [local_seq] (CPU).
  virtual torch::Tensor positions(int64_t local_seq) const = 0;
  // Causal grouped-query attention (attention.h's contract) of this rank's queries over the
  // keys and values of the whole sequence: q [B, Hq, S_local, D], k/v [B, Hkv, S_local, D] in
  // this rank's token order -> [B, Hq, S_local, D]; differentiable in q, k, v (the gradients
  // of other ranks' keys and values travel back to them).
  virtual torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, AttentionKernel kernel) = 0;
  // The sum of x over the cp group (float32/float64); backward sums the gradients over the
  // group too (every rank's loss uses the sum).
  virtual torch::Tensor all_reduce_sum(const torch::Tensor& x) = 0;
  // QK-clip's statistic (attention.h causal_max_logits) of this rank's queries over the keys of
  // the whole sequence, without autograd: q/k as attention() takes them -> float32 [Hq]. Called
  // only while a MaxLogitRecorder is installed; collective over the cp group.
  virtual torch::Tensor max_logits(const torch::Tensor& q, const torch::Tensor& k) = 0;
};

// The hooks a model's forward calls, named after torch FSDP2's unshard / post-forward reshard.
// Contract the model keeps: every parameter use goes through unshard(name, param); a module
// calls post_forward(names, output) once its forward has made its last use of the tensors
// unshard returned for `names`, every such use feeds `output`, and the module continues with
// the returned tensor only. Floating model inputs pass through cast_forward_input and the logits
// through cast_forward_output.
class ParameterMaterializer {
 public:
  virtual ~ParameterMaterializer() = default;
  // The tensor to compute with for parameter `name` (its fully qualified name).
  virtual torch::Tensor unshard(const std::string& name, const torch::Tensor& param) = 0;
  // After the last forward use of `names` in a module: may free their full tensors
  // (reshard_after_forward) and arrange that backward gathers them again before the module's
  // backward runs. Returns the tensor the model continues with (identity by default).
  virtual torch::Tensor post_forward(const std::vector<std::string>& names,
                                     const torch::Tensor& output) {
    (void)names;
    return output;
  }
  virtual torch::Tensor cast_forward_input(const torch::Tensor& input) { return input; }
  virtual torch::Tensor cast_forward_output(const torch::Tensor& output) { return output; }
  // Expert parallelism: the dispatcher of the routed experts, or nullptr when this rank holds
  // every expert (the model then computes as it always did).
  virtual ExpertDispatcher* expert_dispatcher() { return nullptr; }
  // Tensor / context parallelism, or nullptr without (tp = 1 / cp = 1).
  virtual TensorParallelHooks* tensor_parallel() { return nullptr; }
  virtual ContextParallelHooks* context_parallel() { return nullptr; }
};

class CausalLM : public torch::nn::Module {
 public:
  virtual CausalLMOutput forward(const torch::Tensor& input_ids) = 0;
  virtual const ModelConfig& config() const = 0;

  // The role of parameter `name` (a key of named_parameters()). Throws std::invalid_argument
  // for a name the model has no role for (build_model checks that every parameter has one).
  ParamRole param_role(const std::string& name) const;
  // Every parameter's role (core/param_role.h), attention projections with their layer.
  const ParamRoles& param_roles() const { return roles_; }
  // Whether `name` is a routed-expert tensor (role kExpert; expert dim 0).
  bool is_expert(const std::string& name) const { return param_role(name) == ParamRole::kExpert; }
  // Tensor parallelism: the dim along which parameter `name` is split over the tp group (0:
  // column-parallel weights and biases, the vocabulary of embed_tokens and lm_head; 1:
  // row-parallel weights), or -1 when every tp rank holds it whole.
  int64_t tp_dim(const std::string& name) const;

  // Installs (or, with nullptr, removes) the materializer every later forward uses. The model
  // holds it (shared), so the autograd graphs it builds stay valid while the model lives.
  void set_parameter_materializer(std::shared_ptr<ParameterMaterializer> materializer) {
    *materializer_ = std::move(materializer);
  }
  const std::shared_ptr<ParameterMaterializer>& parameter_materializer() const {
    return *materializer_;
  }
  // QK-clip: while installed, every attention forward records its heads' max logits into it
  // (max_logit_recorder.h); nullptr (the default) records nothing.
  // Activation checkpointing (train.activation_checkpointing, model/recompute.h): every
  // `every`-th decoder layer (recomputes_layer; 0 none, 1 all) keeps only its input in forward
  // and recomputes itself in backward. Loss and gradients are bitwise the same.
  void set_activation_checkpointing(int64_t every) { recompute_every_ = every; }
  int64_t activation_checkpointing() const { return recompute_every_; }

  // Model state beside the parameters that the model updates itself (deepseek_v3.h: each MoE
  // layer's expert-selection bias): float32 tensors by name, whole on every rank, saved in
  // checkpoints and Hugging Face exports under these names, never seen by an optimizer. None by
  // default. set_model_state restores one (a checkpoint, HF weights): an unknown name or a
  // wrong shape throws.
  virtual std::map<std::string, torch::Tensor> model_state() { return {}; }
  virtual void set_model_state(const std::string& name, const torch::Tensor& value);
  // While on (the trainer's training forwards; not evaluation), forwards collect the statistics
  // update_model_state folds in (the experts' loads). Off by default.
  void set_collect_state_statistics(bool on) { collect_statistics_ = on; }
  bool collects_state_statistics() const { return collect_statistics_; }
  // After an optimizer step: `sum_over_data` sums a float32 tensor in place over the ranks that
  // saw other tokens (data and context parallel: the same call on each); the model updates its
  // state from the statistics collected since the last call and clears them. A no-op (no
  // collective) for a model without state.
  virtual void update_model_state(const std::function<void(torch::Tensor&)>& sum_over_data) {
    (void)sum_over_data;
  }

  void set_max_logit_recorder(std::shared_ptr<MaxLogitRecorder> recorder) {
    *recorder_ = std::move(recorder);
  }
  const std::shared_ptr<MaxLogitRecorder>& max_logit_recorder() const { return *recorder_; }

 protected:
  // Gives every parameter of `module` (registered under `prefix`, e.g. "model.layers.0.mlp.")
  // the role `role` (an attention projection: with its layer's max-logit key); a model calls it
  // from its constructor for each of its modules.
  void assign_param_role(const std::string& prefix, torch::nn::Module& module, ParamRole role,
                         const std::string& attention_layer = "", const HeadLayout& heads = {});
  // Splits the parameters of `module` (registered under `prefix`) over tp along `dim` (tp_dim);
  // with `weight_only`, only its ".weight" (a row-parallel linear's bias stays whole).
  void assign_tp_dim(const std::string& prefix, torch::nn::Module& module, int64_t dim,
                     bool weight_only = false);

  // Shared with the model's submodules, which read it at every forward (so installing a
  // materializer after construction reaches all of them).
  using MaterializerSlot = std::shared_ptr<std::shared_ptr<ParameterMaterializer>>;
  const MaterializerSlot& materializer_slot() const { return materializer_; }
  using RecorderSlot = std::shared_ptr<std::shared_ptr<MaxLogitRecorder>>;
  const RecorderSlot& max_logit_recorder_slot() const { return recorder_; }

 private:
  MaterializerSlot materializer_ = std::make_shared<std::shared_ptr<ParameterMaterializer>>();
  int64_t recompute_every_ = 0;  // activation checkpointing (set_activation_checkpointing)
  bool collect_statistics_ = false;
  RecorderSlot recorder_ = std::make_shared<std::shared_ptr<MaxLogitRecorder>>();
  ParamRoles roles_;
  std::map<std::string, int64_t> tp_dims_;  // absent: -1
};

// The mean over tokens of the next-token cross-entropy of `logits` [.., V or V/tp] against
// `labels` (int64, the same leading shape), in float32: torch's cross_entropy, or with tensor
// parallelism the vocabulary-parallel one of the model's materializer. per_token: the [N]
// losses instead of their mean.
torch::Tensor causal_lm_cross_entropy(const CausalLM& model, const torch::Tensor& logits,
                                      const torch::Tensor& labels, bool per_token = false);

}  // namespace mixtrain
