// t *= factor exactly as torch.optim's Python code does it (`t.mul_(factor)` with a Python
// float). Python passes the float as a wrapped float64 number tensor, so ATen multiplies in the
// tensor's compute dtype (float for bfloat16/float16) by the factor rounded to that dtype once.
// C++'s t.mul_(double) takes ATen's mul_.Scalar overload instead, which first rounds the factor
// to t's own dtype: for a bfloat16 t, 0.99 becomes 0.98828125 and about half the products
// differ. For float32 and float64 tensors both forms give the same bits.
#pragma once

#include <ATen/ScalarOps.h>
#include <ATen/core/Tensor.h>

namespace mixtrain {

inline const at::Tensor& mul_python_float_(const at::Tensor& t, double factor) {
  t.mul_(at::native::wrapped_scalar_tensor(factor));
  return t;
}

}  // namespace mixtrain
