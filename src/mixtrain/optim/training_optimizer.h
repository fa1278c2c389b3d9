// The optimizer interface the trainer drives: ChainedOptimizer (fp32_main_params: false) or
// MixedPrecisionOptimizer (true), built by build_optimizer().
//
// One step, in Megatron's order (fp32-main-params §8.2, docs/architecture.md §3):
//   accumulate_model_grads() after each micro-batch (or FSDP adds into main_grad(name)),
//   prepare_grads(), clip over grads_for_clipping(), step_with_ready_grads(), zero_grad().
// Every parameter is addressed by its model fully qualified name (fp32-main-params §7.3);
// checkpoint keys follow docs/architecture.md §8:
//   optimizer.state.<fqn>.<exp_avg|exp_avg_sq|momentum_buffer|step|normuon_v>
//   optimizer._mixed_precision_optimizer.fp32_from_fp16_params.<fqn>  (low-precision only)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/core/main_grad_sink.h"
#include "mixtrain/core/param_placement.h"
#include "mixtrain/core/safetensors.h"
#include "mixtrain/optim/routing.h"

namespace mixtrain {

class ChainedOptimizer;
class DynamicLossScaler;

inline constexpr const char* kOptimizerStatePrefix = "optimizer.state.";
inline constexpr const char* kMainParamPrefix =
    "optimizer._mixed_precision_optimizer.fp32_from_fp16_params.";

// Whether optimizer state saved as `saved` loads into live state of dtype `live`: the same
// dtype, or both floating point (cast to `live` on load, as torch.optim does; fp32-main-params §9.3
// branch 2 loads a bfloat16 run's moments into float32 state).
inline bool state_dtype_loads_into(c10::ScalarType saved, c10::ScalarType live) {
  return saved == live || (c10::isFloatingType(saved) && c10::isFloatingType(live));
}

class TrainingOptimizer : public MainGradSink {
 public:
  // float32 gradient-accumulation buffer of a model param (main_grad, fp32-main-params §8.1),
  // created zeroed on first use. FSDP adds reduce-scattered grads here; the single-process trainer
  // calls accumulate_model_grads() after each micro-batch. Throws std::invalid_argument for an
  // unknown name. The reference stays valid until zero_grad().
  virtual at::Tensor& main_grad(const std::string& name) = 0;
  // main_grad(name) += grad, in float32. The step's first call writes 0 + grad in one pass
  // (bitwise what the zeroed buffer plus grad gives: -0 becomes +0) instead of zero-filling the
  // buffer and adding into it.
  void accumulate_main_grad(const std::string& name, const at::Tensor& grad) override = 0;
  // fp32_main_params: for each param with a .grad: main_grad += grad (in float32), then
  // .grad = undefined. The plain chain leaves .grad where it is (no-op).
  virtual void accumulate_model_grads() = 0;
  // fp32_main_params: from now on each low-precision model param's .grad goes into main_grad as
  // soon as autograd has accumulated it (a post-accumulate-grad hook, Megatron's main_grad
  // accumulation), so backward never holds every param's 16-bit gradient at once; .grad stays
  // undefined after backward. Same bits as accumulate_model_grads() after backward while each
  // param's gradient is accumulated once per backward. Undone when the optimizer is destroyed.
  // The trainer opts in; a user's own loop that reads .grad does not. The plain chain: no-op.
  virtual void accumulate_model_grads_in_backward() {}
  // 1.0 except with float16 dynamic loss scaling; the trainer multiplies the loss by it.
  virtual double loss_scale() const = 0;
  // fp32-main-params §8.2 prepare_grads (+ unscale and inf/nan check for float16).
  virtual void prepare_grads() = 0;
  // The float32 grads the leaves will read (defined ones only), for clipping in place.
  virtual std::vector<at::Tensor> grads_for_clipping() = 0;
  // Leaves step (+ copy-back). false: skipped (float16 overflow).
  virtual bool step_with_ready_grads() = 0;
  bool step() {
    prepare_grads();
    return step_with_ready_grads();
  }
  // Sets every grad, optimizer-param grad and main_grad to undefined (Python: "= None"), so the
  // next step sees only what is accumulated after it.
  virtual void zero_grad() = 0;
  // Every group's lr = the lr it was built with * factor.
  virtual void set_lr_factor(double factor) = 0;
  virtual const std::vector<RouteEntry>& routing() const = 0;
  // The leaves behind one interface (the wrapper's inner chain, or the chain itself): parallel
  // layouts use it to tell distributed Muon how each parameter is held.
  virtual ChainedOptimizer& chained() = 0;
  virtual int64_t skipped_steps() const { return 0; }
  // The float16 dynamic loss scaler (null without float16 params), for checkpoints.
  virtual DynamicLossScaler* loss_scaler() { return nullptr; }
  // fp32-main-params §8.3, for the restore paths without main params: main <- model for every
  // low-precision param (no-op where every param is its own main param).
  virtual void reload_model_params() {}

  // Checkpoint view, keys as above. Tensors alias the live state (clone to snapshot).
  virtual NamedTensors state_dict() const = 0;
  // Validates every key, shape and dtype first and modifies nothing on error
  // (std::invalid_argument listing every problem). See the implementations for the branches.
  virtual void load_state_dict(const NamedTensors& state) = 0;
  // The planning half of load_state_dict for state that already exists (after
  // ChainedOptimizer::initialize_state): every problem of `state`, nothing changed. None:
  // load_state_dict(state) cannot fail on data.
  virtual std::vector<std::string> check_state_dict(const NamedTensors& state) const = 0;
};

}  // namespace mixtrain
