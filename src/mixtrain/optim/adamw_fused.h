// The fused AdamW update (kernels/adamw_kernel.h) on tensors, on whichever device they are: the
// CPU capability's variant (select_kernel), one pass per parameter, or the CUDA twin, one
// multi-tensor pass for the whole list (a few launches for very many tensors) on the device's
// current stream, not waited for. The dispatch pattern of every fused kernel: see
// widen_add_fused.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mixtrain/optim/kernels/adamw_kernel.h"

namespace mixtrain {

// One parameter's update.
struct AdamWFusedUpdate {
  at::Tensor param, grad, exp_avg, exp_avg_sq;
  at::Tensor model_param;  // undefined: no copy-back in the pass
  AdamWStepScalars scalars;
};

// Whether the pass takes these tensors: float32, contiguous, strided, all on one device (the
// CPU, or CUDA in a CUDA build), of param's numel.
bool adamw_fusable(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                   const at::Tensor& exp_avg_sq);
// Whether the pass can write `model` for `param`: bfloat16 or float16, contiguous, strided, on
// param's device, of its numel.
bool adamw_fusable_model(const at::Tensor& model, const at::Tensor& param);

// Every update (each adamw_fusable, its model param adamw_fusable_model or undefined, all on one
// device; c10::Error otherwise): param, exp_avg, exp_avg_sq updated, model_param = param rounded
// to nearest even. Bumps the version counters the in-place ops would.
void adamw_step_fused(const std::vector<AdamWFusedUpdate>& updates);

}  // namespace mixtrain
