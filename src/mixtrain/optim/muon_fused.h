// The fused elementwise passes of a Muon step (kernels/muon_kernel.h) on tensors, on whichever
// device they are: the CPU capability's variant (select_kernel) or the CUDA twin
// (kernels/muon_kernel_cuda.h) on the device's current stream. Both give the bits of the unfused
// ATen ops on the CPU (the CUDA twin: the AVX2/AVX-512 variant's; see its header for NaNs).
#pragma once

#include <ATen/core/Tensor.h>

#include "mixtrain/optim/kernels/muon_kernel.h"

namespace mixtrain {

// Whether the passes take `t` next to tensors on `device`: strided, contiguous, on `device` (CPU
// or CUDA), float32 or (unless float32_only) bfloat16 / float16.
bool muon_fusable(const at::Tensor& t, bool float32_only, c10::Device device);

// buffer (float32), grad and out (numel of buffer; float32, bfloat16 or float16), all
// muon_fusable on buffer's device: buffer updated, out = u. Bumps the version counters the
// in-place ops would.
void muon_momentum_fused(const MuonMomentumScalars& s, const at::Tensor& buffer,
                         const at::Tensor& grad, const at::Tensor& out);

// param (float32) and update (param's numel), and model (undefined, or bfloat16 / float16 of
// param's numel), all muon_fusable on param's device: param updated, model = param rounded.
void muon_apply_fused(const MuonApplyScalars& s, const at::Tensor& param, const at::Tensor& update,
                      const at::Tensor& model);

}  // namespace mixtrain
