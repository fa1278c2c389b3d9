// main_grad accumulation of a 16-bit gradient (kernels/widen_add_kernel.h) on tensors, on
// whichever device they are: the CPU capability's variant (select_kernel) or the CUDA twin on
// the device's current stream (no host synchronization). Both give the bits of ATen's
// dst.add_(src) (and, with overwrite, of zeros + src). The dispatch pattern of every fused
// kernel (muon_fused.h, adamw_fused.h, sum_of_squares_fused.h): <kernel>_fusable says which
// tensors the pass takes, <kernel>_fused runs it; callers keep their ATen path for the rest.
#pragma once

#include <ATen/core/Tensor.h>

namespace mixtrain {

// Whether the pass takes dst and src: dst contiguous float32, src contiguous bfloat16 or float16
// of dst's numel, both strided on one device (the CPU, or CUDA in a CUDA build).
bool widen_add_fusable(const at::Tensor& dst, const at::Tensor& src);

// dst = (overwrite ? 0 : dst) + src for widen_add_fusable tensors (c10::Error otherwise); bumps
// dst's version counter as the in-place op would.
void widen_add_fused(const at::Tensor& dst, const at::Tensor& src, bool overwrite);

}  // namespace mixtrain
