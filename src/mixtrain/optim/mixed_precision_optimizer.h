// MixedPrecisionOptimizer: Megatron's Float16OptimizerWithFloat16Params, natively (fp32-main-params
// §7-9, docs/architecture.md §3, §6). Wraps a ChainedOptimizer whose leaves hold the model params.
//
// Construction (fp32-main-params §7.2): for each bfloat16/float16 trainable param, an fp32 main
// param (detach().to(float32), requires_grad as the model param) replaces it in its leaf group,
// taking its state, and the leaf gets set_copy_back(main, model): after each update it
// writes main rounded to nearest even into the model param, fused into its pass. float32
// params are their own main param (the same TensorImpl, no copy). Any other dtype:
// std::invalid_argument naming the parameter, before anything changes. Megatron's three group
// lists, one entry per leaf param group in leaf order: float16_groups (low-precision model
// params), fp32_from_float16_groups (their main params, index-aligned), fp32_from_fp32_groups.
//
// Step (fp32-main-params §8.2): prepare_grads sets main.grad = float32(main_grad if defined else
// grad) and clears the model grad; float32 params get grad = main_grad when it is defined. With any
// float16 param a DynamicLossScaler unscales the main grads and skips steps with inf/nan.
// zero_grad clears grad, main.grad and main_grad (all undefined).
//
// Checkpoint (fp32-main-params §9.1, §9.3): state_dict adds
// optimizer._mixed_precision_optimizer.fp32_from_fp16_params.<fqn> for low-precision params
// (none for float32 models). load_state_dict plans first (creates the leaves' state, collects
// every problem with check_state_dict, drops the created state again on any), then applies:
//   all main params present -> exact restore (copied as float32, never through bf16);
//   none present            -> leaf state restored, reload_model_params(), log_warn that the
//                              fp32 mantissa the low-precision model lost cannot come back;
//   some present            -> std::invalid_argument listing the missing names, nothing
//                              modified.
// The model params themselves are loaded by the caller (model.<fqn> keys), before this.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/loss_scaler.h"
#include "mixtrain/optim/training_optimizer.h"

namespace mixtrain {

class MixedPrecisionOptimizer : public TrainingOptimizer {
 public:
  // scaler_options apply when some trainable param is float16.
  explicit MixedPrecisionOptimizer(std::unique_ptr<ChainedOptimizer> chained,
                                   DynamicLossScalerOptions scaler_options = {});

  ChainedOptimizer& chained() override { return *chained_; }
  const ChainedOptimizer& chained() const { return *chained_; }
  // The fp32 param the leaves update for model param `name` (the model param itself for
  // float32). Throws std::invalid_argument for an unknown name.
  const at::Tensor& main_param(const std::string& name) const;
  bool is_own_main_param(const std::string& name) const;
  // Names of the bfloat16/float16 params (those with a separate main param), chain order.
  const std::vector<std::string>& low_precision_names() const { return low_precision_names_; }

  const std::vector<std::vector<at::Tensor>>& float16_groups() const { return float16_groups_; }
  const std::vector<std::vector<at::Tensor>>& fp32_from_float16_groups() const {
    return fp32_from_float16_groups_;
  }
  const std::vector<std::vector<at::Tensor>>& fp32_from_fp32_groups() const {
    return fp32_from_fp32_groups_;
  }
  // Null unless the model has float16 params. Mutable for checkpoint restore.
  DynamicLossScaler* loss_scaler() override { return scaler_.get(); }
  const DynamicLossScaler* loss_scaler() const { return scaler_.get(); }

  // fp32-main-params §8.3: main <- model for every low-precision param. Only for restore paths that
  // have no main params (model-only restore, plain optimizer checkpoints): it loses the mantissa
  // bits the low-precision model cannot hold.
  void reload_model_params() override;

  // TrainingOptimizer
  at::Tensor& main_grad(const std::string& name) override;
  void accumulate_main_grad(const std::string& name, const at::Tensor& grad) override;
  void accumulate_model_grads() override;
  void accumulate_model_grads_in_backward() override;
  ~MixedPrecisionOptimizer() override;
  double loss_scale() const override { return scaler_ ? scaler_->scale() : 1.0; }
  void prepare_grads() override;
  std::vector<at::Tensor> grads_for_clipping() override;
  bool step_with_ready_grads() override;
  void zero_grad() override;
  void set_lr_factor(double factor) override { chained_->set_lr_factor(factor); }
  const std::vector<RouteEntry>& routing() const override { return chained_->routing(); }
  int64_t skipped_steps() const override { return scaler_ ? scaler_->skipped_steps() : 0; }
  NamedTensors state_dict() const override;
  void load_state_dict(const NamedTensors& state) override;
  // The main-param keys above, then the chain's check of the leaf state.
  std::vector<std::string> check_state_dict(const NamedTensors& state) const override;

 private:
  std::unique_ptr<ChainedOptimizer> chained_;
  std::vector<std::string> low_precision_names_;
  std::vector<std::string> fp32_names_;
  std::vector<std::vector<at::Tensor>> float16_groups_;
  std::vector<std::vector<at::Tensor>> fp32_from_float16_groups_;
  std::vector<std::vector<at::Tensor>> fp32_from_fp32_groups_;
  std::unique_ptr<DynamicLossScaler> scaler_;
  bool found_inf_ = false;     // set by prepare_grads, consumed by step_with_ready_grads
  bool grads_hooked_ = false;  // accumulate_model_grads_in_backward ran (hooks to remove)
};

}  // namespace mixtrain
