// AdamW, fused: torch.optim.AdamW with amsgrad off (docs/architecture.md §5), as a LibTorch
// optimizer.
//
// Per parameter p with gradient g and its own step count t (1 at its first step), with the
// group's lr, betas (beta1, beta2), eps and weight_decay (wd); exactly PyTorch's single-tensor
// update (torch/optim/adamw.py, foreach=False, the CPU default), scalars computed in double:
//   p.mul_(1 - lr * wd)
//   exp_avg.lerp_(g, 1 - beta1)
//   exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2)
//   bias_correction1 = 1 - beta1^t;  bias_correction2 = 1 - beta2^t
//   step_size = lr / bias_correction1
//   denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)).add_(eps)
//   p.addcdiv_(exp_avg, denom, -step_size)
// then, when set_copy_back() gave p a bfloat16/float16 model param, model_param = p rounded to
// nearest even (what Tensor::to gives).
//
// Fused path (float32 contiguous CPU param, grad and moments): one vectorized pass
// (kernels/adamw_kernel.h) that also writes the model param. It is BITWISE equal to the op
// sequence above run by LibTorch 2.11 at the same CPU capability (ATen picks the best the CPU
// has, as we do; ATEN_CPU_CAPABILITY and MIXTRAIN_CPU_CAPABILITY lower them). The capability
// matters: ATen's AVX2/AVX-512 builds fuse lerp_ and addcmul_ into multiply-adds and its
// DEFAULT build does not, and each of our variants does what ATen's does. sqrt is not correctly
// rounded in the torch wheel (ATen takes it from MKL VML, about 0.6% of results 1 ulp off), so
// the kernel calls that same MKL function (verified against the installed LibTorch 2.11 by
// tests/unit/optim/adamw_test.cpp). Everything else (a
// bfloat16/float16 param without main params, non-contiguous tensors) runs that op sequence
// itself, with state in the param's dtype.
//
// CUDA path (float32 contiguous param, grad and moments on one CUDA device): the step collects
// every such parameter and updates them all in one multi-tensor pass (adamw_fused.h,
// kernels/adamw_kernel.h's CUDA::adamw_step; a few launches for very many tensors) on the
// current stream at the end of step(), without waiting for the device. Same per-element
// operations as the AVX2/AVX-512 kernels except a correctly rounded sqrt (the CPU's is MKL's),
// so moments are bitwise the CPU's and params wherever MKL's square root is correctly rounded.
// With the swap optimizer each parameter is launched alone inside its acquire/release.
//
// Differs from torch::optim::AdamW (LibTorch's C++ port) in the last bits only: that one
// updates exp_avg as mul_(beta1).add_(g, 1 - beta1) instead of lerp_.
//
// State: torch::optim::AdamWParamState (step, exp_avg, exp_avg_sq; zeros in the param's dtype
// at its first step), keyed like torch's. Params whose grad is undefined are skipped.
#pragma once

#include <torch/optim/adamw.h>

#include <string>
#include <vector>

#include "mixtrain/optim/leaf_optimizer.h"

namespace mixtrain {

class AdamW : public LeafOptimizer {
 public:
  // Throws std::invalid_argument for amsgrad(true) or an out-of-range hyperparameter in the
  // defaults or any group.
  explicit AdamW(std::vector<torch::optim::OptimizerParamGroup> groups,
                 torch::optim::AdamWOptions defaults = {});

  at::Tensor step(LossClosure closure = nullptr) override;
  std::string kind() const override { return "adamw"; }

  // torch.optim.AdamW(fused=True)'s form instead of the single-tensor one (false, the default):
  // the fused pass takes a correctly rounded sqrt (kernels/adamw_kernel.h AdamWStepScalars), as
  // ATen's _fused_adamw_ does on the CPU; the other operations are the same, except in the last
  // numel % (ATen's float lanes) elements of a CPU param, where ATen's kernel runs scalar code
  // whose multiply-adds its compiler contracted: those go through _fused_adamw_ itself. Only the
  // fused pass has the form (float32 contiguous params); the op-sequence fallback keeps ATen's
  // single-tensor sqrt.
  void set_fused_form(bool fused) { fused_form_ = fused; }
  bool fused_form() const { return fused_form_; }

  // "exp_avg", "exp_avg_sq" (aliases of the live state) and "step" (int64 scalar tensor);
  // empty before the param's first step.
  NamedTensorList export_state(const at::Tensor& param) const override;
  // The same three names (LeafOptimizer::read_state: a whole-number float step is accepted);
  // an empty list clears the param's state.
  void import_state(const at::Tensor& param, const NamedTensorList& state) override;
  std::vector<StateField> state_fields() const override;
  void set_lr(double lr) override;

  // {"betas": [beta1, beta2], "eps", "weight_decay", "amsgrad"} (amsgrad must stay false).
  nlohmann::json group_hyperparameters(size_t group) const override;
  std::unique_ptr<torch::optim::OptimizerOptions> options_with_hyperparameters(
      size_t group, const nlohmann::json& values) const override;

 private:
  bool fused_form_ = false;
};

}  // namespace mixtrain
