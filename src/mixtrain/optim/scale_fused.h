// In-place scaling of many float32 CPU tensors by one factor in one call (kernels/scale_kernel.h):
// gradient clipping's coefficient applied to every gradient without one dispatched op (and a
// wrapped-scalar cast) per tensor. The bits of ATen's t.mul_(coefficient). The dispatch pattern
// of the fused kernels (widen_add_fused.h): scale_fusable says which tensors the pass takes,
// scale_fused runs it; callers keep their ATen path for the rest.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace mixtrain {

// Whether the pass takes t: a contiguous, strided float32 CPU tensor.
bool scale_fusable(const at::Tensor& t);

// t *= coefficient for every tensor of `tensors` (each scale_fusable: c10::Error otherwise);
// bumps their version counters as the in-place op would.
void scale_fused(const std::vector<at::Tensor>& tensors, double coefficient);

}  // namespace mixtrain
