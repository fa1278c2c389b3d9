// ChainedOptimizer (fp32-main-params §7.1, §7.3; Megatron's ChainedOptimizer): the leaf optimizers
// (AdamW, and Muon when configured) behind one TrainingOptimizer interface, for fp32_main_params:
// false. The leaves read the optimizer params' .grad.
//
// It keeps the two-way maps optimizer param <-> model param and name <-> model param, so the
// LR schedule, logs and checkpoints keep using the model's fully qualified names after the
// mixed-precision wrapper swapped main params into the leaf groups (replace_parameter).
// State is keyed by the model param's name: optimizer.state.<fqn>.<state name>.
//
// main_grad(name) (a float32 buffer, e.g. written by FSDP) takes precedence over .grad:
// prepare_grads sets the optimizer param's grad to it (the same tensor for a float32 param,
// a cast otherwise). accumulate_model_grads is a no-op: .grad accumulates by itself.
//
// load_state_dict (fp32-main-params §9.2): first creates the lazy state of every parameter that has
// none with one zero-lr step on zero grads (parameters untouched), then checks every key, shape and
// dtype against it; on any problem it drops that created state again and throws
// std::invalid_argument listing all problems. Every optimizer.state key of every trainable
// parameter must be present; any other key is an error. A floating-point state saved in
// another floating dtype (a bfloat16 run's moments loaded into float32 state, or back) is
// cast to the live state's dtype, as torch.optim.Optimizer.load_state_dict casts to the
// param's dtype; integer state (step counters) must match exactly.
//
// Param-group hyper-parameters (fp32-main-params §2.2: restored from a checkpoint, as torch.optim's
// load_state_dict restores param_groups): param_groups_state() / load_param_groups_state(),
// one JSON object per (leaf, group), in leaf order then group order:
//   {"optimizer": "adamw" | "muon", "group": g, "params": [model fqns, group order],
//    "base_lr": the lr the LR schedule multiplies, + the leaf's group_hyperparameters(g)}.
#pragma once

#include <torch/optim/optimizer.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mixtrain/optim/leaf_optimizer.h"
#include "mixtrain/optim/state_swap.h"
#include "mixtrain/optim/training_optimizer.h"

namespace mixtrain {

class ChainedOptimizer : public TrainingOptimizer {
 public:
  // Key type of torch::optim::Optimizer::state() (the param's TensorImpl*).
  using StateKey =
      std::decay_t<decltype(std::declval<const torch::optim::Optimizer&>().state().begin()->first)>;

  // What initialize_state() created, so undo_initialize_state() can drop exactly that.
  class StateInitialization {
   public:
    const std::vector<std::string>& names() const { return names_; }

   private:
    friend class ChainedOptimizer;
    std::vector<std::string> names_;
    std::vector<std::pair<size_t, StateKey>> keys_;  // (leaf index, state key)
  };

  ChainedOptimizer() = default;

  // Adds a leaf. named_params lists every parameter of the leaf's groups exactly once, by
  // model name (the leaf's params are the model params at this point). Throws
  // std::invalid_argument for a mismatch or a name/parameter another leaf already has.
  // Shared: a mixtrain.optim optimizer object keeps its leaf too (docs/python.md).
  void add_leaf(std::shared_ptr<LeafOptimizer> leaf, const NamedTensors& named_params);
  // The routing table routing() reports (build_optimizer sets it).
  void set_routing(std::vector<RouteEntry> routes) { routes_ = std::move(routes); }

  const std::vector<std::shared_ptr<LeafOptimizer>>& leaves() const { return leaves_; }

  // Swap optimizer (state_swap.h): from now on the leaves' state lives in `swap`'s file
  // between steps. step_with_ready_grads and initialize_state bracket the leaf steps with
  // begin_step / end_step; state_dict reads through it; import_checked_state writes into it.
  void enable_state_swap(std::unique_ptr<StateSwap> swap);
  StateSwap* state_swap() const { return swap_.get(); }
  // Parameter names in the order they were added.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // These throw std::invalid_argument for an unknown name or parameter.
  const at::Tensor& model_param(const std::string& name) const;
  const at::Tensor& optimizer_param(const std::string& name) const;
  LeafOptimizer& leaf_of(const std::string& name) const;
  // Name of an optimizer param (or of a model param: both maps are searched), by identity.
  const std::string& name_of(const at::Tensor& param) const;

  // Puts new_param where the optimizer param of `name` was in its leaf group (its state
  // moves with it), rebuilds the leaf's per-parameter caches and updates the maps. The model
  // param of `name` stays. The batch form rebuilds each touched leaf's caches once.
  void replace_parameter(const std::string& name, const at::Tensor& new_param);
  void replace_parameters(const NamedTensors& replacements);

  // fp32-main-params §9.2: gives every parameter without state its (zero) state by one leaf step
  // with lr 0 and zero grads; parameter values, grads, lrs and existing state are as before.
  // Copy-back targets of the stepped params are written (with the unchanged value rounded), so the
  // mixed-precision wrapper redirects them first.
  StateInitialization initialize_state();
  void undo_initialize_state(const StateInitialization& created);
  // Every problem of `state` (optimizer.state.* keys only) against the current state
  // structure: missing, unexpected or duplicate keys, shape and dtype mismatches (see
  // state_dtype_loads_into), then each parameter's values as its leaf checks them
  // (LeafOptimizer::check_state: a step that is no whole number >= 0). Changes nothing;
  // import_checked_state cannot fail on a state without problems.
  std::vector<std::string> check_state_dict(const NamedTensors& state) const override;

  // TrainingOptimizer
  at::Tensor& main_grad(const std::string& name) override;
  void accumulate_main_grad(const std::string& name, const at::Tensor& grad) override;
  void accumulate_model_grads() override {}
  double loss_scale() const override { return 1.0; }
  void prepare_grads() override;
  std::vector<at::Tensor> grads_for_clipping() override;
  bool step_with_ready_grads() override;
  void zero_grad() override;
  void set_lr_factor(double factor) override;
  const std::vector<RouteEntry>& routing() const override { return routes_; }
  ChainedOptimizer& chained() override { return *this; }
  NamedTensors state_dict() const override;
  void load_state_dict(const NamedTensors& state) override;

  // The hyper-parameters of every param group (see the top of this file), for checkpoints.
  nlohmann::json param_groups_state() const;
  // A checked param-group restore: plan_param_groups reads and checks everything, changing
  // nothing; apply_param_groups then cannot fail on data.
  class ParamGroupsPlan {
   public:
    bool ok() const { return problems_.empty(); }
    // Every problem, each naming the group ("muon group 0") and the field.
    const std::vector<std::string>& problems() const { return problems_; }
    // The one message for them (what load_param_groups_state throws); "" when ok().
    const std::string& error() const { return error_; }

   private:
    friend class ChainedOptimizer;
    struct Slot {
      size_t leaf;
      size_t group;
      std::string label;  // "muon group 0"
      double base_lr;
      std::unique_ptr<torch::optim::OptimizerOptions> options;  // lr as before
    };
    std::vector<Slot> slots_;
    std::vector<std::string> problems_;
    std::string error_;
  };
  // `groups` must hold exactly one object per current (leaf, group), in the same order, with
  // the same optimizer kind, group index and params list, a base_lr >= 0 and every
  // hyper-parameter of the leaf (right JSON type, valid value, nothing else); the plan holds
  // every problem (LeafOptimizer::options_with_hyperparameters checks the values).
  ParamGroupsPlan plan_param_groups(const nlohmann::json& groups) const;
  // Sets every group's hyper-parameters and base lr; each group's lr becomes base_lr * the
  // factor last given to set_lr_factor (1 before any). Returns one line per value that
  // differs from the one the optimizer had (its config), for the caller to log as a warning:
  //   "adamw group 0 weight_decay: checkpoint 0.01, config 0.1".
  // std::logic_error for a plan with problems.
  std::vector<std::string> apply_param_groups(ParamGroupsPlan plan);
  // Both: std::invalid_argument with plan.error() (listing every problem) and nothing
  // changed, or the differences.
  std::vector<std::string> load_param_groups_state(const nlohmann::json& groups);

  // How each parameter is held across ranks (by placement.name; core/param_placement.h): kept
  // for clip_grad_norm and handed to the parameter's leaf (set_placement). Parameters never
  // given one are kWhole. Throws std::invalid_argument for a name that is not a trainable
  // parameter here, changing nothing.
  void set_placements(const std::vector<ParamPlacement>& placements);
  // The placement of `name` (kWhole until set_placements); std::invalid_argument if unknown.
  const ParamPlacement& placement(const std::string& name) const { return entry(name).placement; }
  // torch.nn.utils.clip_grad_norm_ (norm type 2) over the whole parameters whose local pieces
  // these grads are (grad_clip.h, placed form); returns the pre-clip norm. Collective over the
  // placements' groups when any piece is sharded.
  double clip_grad_norm(double max_norm);
  // The same without a host read on CUDA (grad_clip.h clip_grad_norm_unread): the pre-clip norm
  // as a 0-dim float64 tensor on the grads' device.
  at::Tensor clip_grad_norm_unread(double max_norm);
  // `local` or'ed over every rank holding another piece of a parameter this rank holds a piece
  // of (one all-reduce per distinct pieces group, in parameter order: collective over them).
  // The float16 loss scaler's inf/nan flag: each FSDP or expert shard sees only its rows, and
  // every rank must skip the same steps. Replicas (HSDP, DDP, expert_dp) hold equal grads,
  // so their flags already agree; the ep group lies inside dp_shard, so one round suffices;
  // then one round over each tp group of a tp-split parameter (tp slices differ; parameters
  // whole on every tp rank have identical grads there).
  bool any_piece_holder(bool local);
  // The same on a flag tensor (int64 [1], 0 or 1; on the groups' device or the CPU), not read:
  // summed over each group in turn, so the result is > 0 wherever any holder's flag was.
  at::Tensor any_piece_holder(const at::Tensor& local);

  // main_grad of `name` if it was created since the last zero_grad, else undefined.
  at::Tensor main_grad_if_defined(const std::string& name) const;
  // Imports already checked optimizer.state.* entries into the leaves (copies).
  void import_checked_state(const NamedTensors& state);

 private:
  struct Entry {
    at::Tensor model_param;
    at::Tensor optimizer_param;
    size_t leaf = 0;
    at::Tensor main_grad;
    ParamPlacement placement;  // kWhole until set_placements
  };
  const Entry& entry(const std::string& name) const;
  // Each parameter's optimizer-param grad (undefined: none) and placement, in name order.
  void grads_and_placements(std::vector<at::Tensor>& grads,
                            std::vector<const ParamPlacement*>& placements) const;
  // (leaf, optimizer param) of every parameter, in name order.
  std::vector<std::pair<LeafOptimizer*, at::Tensor>> leaf_params() const;

  std::vector<std::shared_ptr<LeafOptimizer>> leaves_;
  std::unique_ptr<StateSwap> swap_;  // declared after leaves_: destroyed before them
  // Throws std::logic_error when a leaf gained param groups after add_leaf.
  void check_group_counts() const;

  std::vector<std::vector<double>> base_lrs_;  // [leaf][group]: lr as built (or as loaded)
  double lr_factor_ = 1.0;                     // the last set_lr_factor
  std::vector<std::string> names_;
  std::unordered_map<std::string, Entry> entries_;
  std::unordered_map<const void*, std::string> optimizer_param_names_;  // by TensorImpl
  std::unordered_map<const void*, std::string> model_param_names_;      // by TensorImpl
  std::vector<RouteEntry> routes_;
};

// Joins load problems into one message: "<what>: N problem(s):\n  - ...".
std::string format_load_problems(const std::string& what, const std::vector<std::string>& problems);

}  // namespace mixtrain
