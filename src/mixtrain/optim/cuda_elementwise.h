// The optimizer's CUDA elementwise kernels (kernels/*.cu) for at::Tensor arguments: each call
// enqueues its work on the current stream of the tensors' device and returns without waiting for
// the device (no host synchronization). The callers (AdamW::step, grad_clip,
// ChainedOptimizer::accumulate_main_grad) pick these for CUDA tensors and the CPU kernels for
// CPU tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mixtrain/optim/kernels/adamw_kernel.h"

namespace mixtrain {

// One parameter's AdamW update (kernels/adamw_kernel.h, CUDA::adamw_step).
struct AdamWCudaUpdate {
  at::Tensor param, grad, exp_avg, exp_avg_sq;
  at::Tensor model_param;  // undefined: no copy-back in the pass
  AdamWStepScalars scalars;
};

// Whether the CUDA AdamW pass takes these tensors: float32, contiguous, strided, on one CUDA
// device, grad of param's numel.
bool adamw_cuda_fusable(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                        const at::Tensor& exp_avg_sq);
// Whether `model` can be written by the pass for `param`: bfloat16 or float16, contiguous, on
// param's device, of its numel.
bool adamw_cuda_fusable_model(const at::Tensor& model, const at::Tensor& param);

// Every update (each adamw_cuda_fusable, all on one device) in one multi-tensor pass, a few
// launches for very many tensors.
void adamw_step_cuda(const std::vector<AdamWCudaUpdate>& updates);

// The sum of squares of the tensors (contiguous float32, bfloat16 or float16, all on one CUDA
// device; none: 0) as a 0-dim float64 tensor on that device; deterministic
// (kernels/sum_of_squares_kernel.h, CUDA::sum_of_squares). `device` names the device when the
// list is empty.
at::Tensor sum_of_squares_cuda(const std::vector<at::Tensor>& tensors, const at::Device& device);

// dst (contiguous float32) = (overwrite ? 0 : dst) + src (contiguous bfloat16 or float16, same
// device and numel), bitwise dst.add_(src) (kernels/widen_add_kernel.h, CUDA::widen_add).
void widen_add_cuda(const at::Tensor& dst, const at::Tensor& src, bool overwrite);

}  // namespace mixtrain
