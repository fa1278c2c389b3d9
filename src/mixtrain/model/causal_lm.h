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

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/config/trainer_config.h"

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
// each source's expert gradient reaches the materializer on its own (qwen2_moe.cpp says why).
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
};

enum class ParamRole {
  kEmbedding,   // token embedding table
  kAttention,   // q/k/v/o projections (weights and biases)
  kMlp,         // dense feed-forward (a dense model's MLP, a MoE model's shared expert)
  kRouter,      // MoE router (gate) and the shared-expert gate
  kExpert,      // routed experts, expert dim 0
  kNorm,        // normalisation scales
  kOutputHead,  // the output projection to the vocabulary (lm_head)
};

const char* param_role_name(ParamRole role);  // "embedding", "attention", ...

class CausalLM : public torch::nn::Module {
 public:
  virtual CausalLMOutput forward(const torch::Tensor& input_ids) = 0;
  virtual const ModelConfig& config() const = 0;

  // The role of parameter `name` (a key of named_parameters()). Throws std::invalid_argument
  // for a name the model has no role for (build_model checks that every parameter has one).
  ParamRole param_role(const std::string& name) const;
  // Whether `name` is a routed-expert tensor (role kExpert; expert dim 0).
  bool is_expert(const std::string& name) const { return param_role(name) == ParamRole::kExpert; }

  // Installs (or, with nullptr, removes) the materializer every later forward uses. The model
  // holds it (shared), so the autograd graphs it builds stay valid while the model lives.
  void set_parameter_materializer(std::shared_ptr<ParameterMaterializer> materializer) {
    *materializer_ = std::move(materializer);
  }
  const std::shared_ptr<ParameterMaterializer>& parameter_materializer() const {
    return *materializer_;
  }

 protected:
  // Gives every parameter of `module` (registered under `prefix`, e.g. "model.layers.0.mlp.")
  // the role `role`; a model calls it from its constructor for each of its modules.
  void assign_param_role(const std::string& prefix, torch::nn::Module& module, ParamRole role);

  // Shared with the model's submodules, which read it at every forward (so installing a
  // materializer after construction reaches all of them).
  using MaterializerSlot = std::shared_ptr<std::shared_ptr<ParameterMaterializer>>;
  const MaterializerSlot& materializer_slot() const { return materializer_; }

 private:
  MaterializerSlot materializer_ = std::make_shared<std::shared_ptr<ParameterMaterializer>>();
  std::map<std::string, ParamRole> roles_;
};

}  // namespace mixtrain
