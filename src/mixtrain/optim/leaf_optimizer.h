// Base of the leaf optimizers (AdamW, Muon, SGD): LibTorch's torch::optim::Optimizer conventions
// (param_groups(), state(), step(), zero_grad()), so a LibTorch user can drop one into an
// ordinary training loop, plus the three hooks the mixed-precision wrapper needs (fp32-main-params
// §7.2-7.3):
//
// - replace_parameter(old, new): put `new` where `old` was in its param group and move its
//   state with it (the wrapper swaps each low-precision model param for its fp32 main param);
// - set_copy_back(param, model_param): after every update of `param`, write its value rounded
//   to model_param's dtype (round to nearest even, as Tensor::to does) into model_param. Leaves
//   fuse this into their update pass, so the low-precision weights are written while the
//   fp32 value is still in registers;
// - reset_parameter_caches(): rebuild whatever a leaf caches per parameter object (Muon's
//   same-shape batches) after parameters were replaced.
//
// State is exported and imported per parameter as named tensors ("exp_avg", "exp_avg_sq",
// "momentum_buffer", "step"), so the owner can key it by the model parameter's name.
//
// Param-group hyper-parameters (everything but lr, which the owner keeps as base lr * LR
// schedule factor) are exported and imported as one JSON object per group, under the config's
// names, for checkpoints (as torch.optim.Optimizer.load_state_dict restores param_groups).
#pragma once

#include <torch/optim/optimizer.h>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mixtrain/core/param_placement.h"

namespace mixtrain {

class StateSwap;

using NamedTensorList = std::vector<std::pair<std::string, at::Tensor>>;

// One per-parameter state entry a leaf declares (state_fields()), by its export_state name.
struct StateField {
  enum class Kind {
    // A tensor of the parameter's shape, stored as a private copy in the parameter's dtype.
    kLikeParam,
    // A tensor of the parameter's shape without its last dim (one value per row: NorMuon's
    // normuon_v); its rows follow the parameter's rows when the parameter is sharded on dim 0.
    kPerRow,
    // One whole number >= min (a step counter): a one-element integer tensor, or a floating
    // one holding a whole number (torch.optim saves `step` as a float32 tensor); 1.5 is refused.
    kCount,
  };
  std::string name;
  Kind kind = Kind::kLikeParam;
  bool required = true;  // false: may be absent (SGD's momentum_buffer before momentum is used)
  int64_t min = 0;       // kCount only
};

// One parameter's state as read by LeafOptimizer::read_state: every declared field present in
// the input, checked. Empty: the parameter has no state (an empty input list).
struct CheckedState {
  std::unordered_map<std::string, at::Tensor> tensors;  // kLikeParam / kPerRow fields, as given
  std::unordered_map<std::string, int64_t> counts;      // kCount fields
  bool empty() const { return tensors.empty() && counts.empty(); }
};

class LeafOptimizer : public torch::optim::Optimizer {
 public:
  using torch::optim::Optimizer::Optimizer;

  // "adamw" or "muon": used in logs and error messages.
  virtual std::string kind() const = 0;

  void replace_parameter(const at::Tensor& old_param, const at::Tensor& new_param);
  void set_copy_back(const at::Tensor& param, const at::Tensor& model_param);
  virtual void reset_parameter_caches() {}
  // How `param` is held across ranks (core/param_placement.h), set by the parallel layout
  // before the first step. Elementwise leaves update any piece as they would the whole and
  // ignore it (the default); a leaf whose update couples elements (Muon) keys its distributed
  // path on it. Throws std::invalid_argument for a param in no group.
  virtual void set_placement(const at::Tensor& param, const ParamPlacement& placement) {
    (void)param;
    (void)placement;
  }

  // State of one parameter (empty before its first step). Tensors alias the live state.
  virtual NamedTensorList export_state(const at::Tensor& param) const = 0;
  // Replaces the state of one parameter with copies of `state` (same names as export_state);
  // an empty list drops its state (export_state's answer for a parameter without one). Throws
  // std::invalid_argument listing every problem check_state finds, changing nothing.
  virtual void import_state(const at::Tensor& param, const NamedTensorList& state) = 0;

  // The per-parameter state this leaf keeps, for check_state / read_state (the one state
  // import every leaf uses). Empty (the default) for a leaf that checks its own.
  virtual std::vector<StateField> state_fields() const { return {}; }
  // Every problem of `state` as import_state input for `param` (a parameter of a group):
  // unknown, duplicate, undefined or missing keys, a tensor of another shape, a count that is
  // not one whole number >= its min. Each names the key ("'step' must be ..."); none: it can
  // be imported; a leaf without state_fields() gets none. Changes nothing.
  std::vector<std::string> check_state(const at::Tensor& param, const NamedTensorList& state) const;
  // Whether `name` is a declared kCount field (its dtype may be any real one; check_state
  // decides on the value).
  bool is_count_field(const std::string& name) const;
  // check_state, then the values; std::invalid_argument "<kind>: import_state: <problems>".
  CheckedState read_state(const at::Tensor& param, const NamedTensorList& state) const;

  // Learning rate of every group (the LR schedule sets base_lr * factor each step).
  virtual void set_lr(double lr) = 0;

  // The hyper-parameters of param group `group` except lr, as a JSON object (field names as
  // the leaf documents them). Throws std::out_of_range for a group that does not exist.
  virtual nlohmann::json group_hyperparameters(size_t group) const = 0;
  // The options group `group` would have with `values` (an object with exactly the fields
  // group_hyperparameters gives), lr as it is: checks every field (present, right JSON type,
  // valid value; no other field) and throws std::invalid_argument naming the field. Pure: the
  // planning half of a param-group restore.
  virtual std::unique_ptr<torch::optim::OptimizerOptions> options_with_hyperparameters(
      size_t group, const nlohmann::json& values) const = 0;
  // Sets group `group`'s options to options_with_hyperparameters(group, values); on a throw
  // nothing changed.
  void set_group_hyperparameters(size_t group, const nlohmann::json& values);

  // Swap optimizer (state_swap.h): the leaf brackets each parameter's state use with
  // acquire_state / release_state. Null (the default): state stays in memory.
  void set_state_swap(StateSwap* swap) { swap_ = swap; }
  StateSwap* state_swap() const { return swap_; }

 protected:
  // torch.optim's step(closure): the closure's loss, computed with grad mode on (undefined
  // without a closure).
  static at::Tensor evaluate_closure(const LossClosure& closure);
  // For the constructors: throws std::invalid_argument "<kind()>: defaults: <problem>" or
  // "<kind()>: param group <i>: <problem>" for the first of the defaults, then each group's
  // options, for which problem(options) is not "".
  template <typename Options>
  void check_options(std::string (*problem)(const Options&)) const {
    check_each_options([problem](const torch::optim::OptimizerOptions& options) {
      return problem(static_cast<const Options&>(options));
    });
  }
  void acquire_state(const at::Tensor& param);
  void release_state(const at::Tensor& param);
  // acquire_state(param) for the lease's scope: release_state runs when it ends normally
  // (return, continue, end of block). While an exception unwinds it does nothing, as the
  // unpaired calls did: the step has failed and release may itself throw.
  class StateLease {
   public:
    StateLease(LeafOptimizer& leaf, const at::Tensor& param);
    ~StateLease() noexcept(false);
    StateLease(const StateLease&) = delete;
    StateLease& operator=(const StateLease&) = delete;

   private:
    LeafOptimizer& leaf_;
    const at::Tensor& param_;
    int exceptions_;  // std::uncaught_exceptions() at construction
  };
  static void* state_key(const at::Tensor& param);
  // Undefined tensor when `param` has no copy-back target.
  at::Tensor copy_back_target(const at::Tensor& param) const;

 private:
  void check_each_options(
      const std::function<std::string(const torch::optim::OptimizerOptions&)>& problem) const;

  StateSwap* swap_ = nullptr;
  std::unordered_map<const void*, at::Tensor> copy_back_;  // keyed by TensorImpl
};

// Reads the fields of a set_group_hyperparameters object, each throwing
// std::invalid_argument naming the field when it is missing or of another JSON type:
// "missing field 'eps'", "field 'eps' must be a number, got string". finish() throws for a
// field nothing read ("unexpected field 'lr'").
class HyperparameterReader {
 public:
  explicit HyperparameterReader(const nlohmann::json& values);  // throws unless an object

  double number(const std::string& name);    // any JSON number
  int64_t integer(const std::string& name);  // an integer JSON number (5, not 5.0)
  bool boolean(const std::string& name);
  std::string string(const std::string& name);
  // A field of any type, for the caller to check.
  const nlohmann::json& field(const std::string& name);
  void finish() const;

 private:
  const nlohmann::json& values_;
  std::set<std::string> read_;
};

// "field 'name' must be <what>, got <JSON type name>", for reader users that check further.
std::string hyperparameter_type_error(const std::string& name, const std::string& what,
                                      const nlohmann::json& value);

}  // namespace mixtrain
