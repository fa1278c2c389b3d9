// The sum of squares of a list of tensors (kernels/sum_of_squares_kernel.h) on whichever device
// they are: the CPU capability's variant (select_kernel; one parallel region for the whole list,
// bit-identical for any thread count) or the CUDA twin (deterministic partials, on the device's
// current stream, not waited for). The dispatch pattern of every fused kernel: see
// widen_add_fused.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace mixtrain {

// Whether the pass takes `t`: float32, bfloat16 or float16, strided, on the CPU or (in a CUDA
// build) a CUDA device. Any strides: the pass reads a contiguous copy of a non-contiguous one.
bool sum_of_squares_fusable(const at::Tensor& t);

// The sum of squares of every element of `tensors` (each sum_of_squares_fusable and on `device`,
// c10::Error otherwise; none: 0) as a 0-dim float64 tensor on `device`.
at::Tensor sum_of_squares_fused(const std::vector<at::Tensor>& tensors, const at::Device& device);

}  // namespace mixtrain
