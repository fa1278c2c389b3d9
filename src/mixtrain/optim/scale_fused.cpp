#include "mixtrain/optim/scale_fused.h"

#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/optim/kernels/scale_kernel.h"

namespace mixtrain {
namespace {

using ScaleKernel = void (*)(float* const*, const int64_t*, int64_t, float);

ScaleKernel scale_cpu_kernel() {
  static const ScaleKernel kernel =
      select_kernel<ScaleKernel>(DEFAULT::scale_many, AVX2::scale_many, AVX512::scale_many);
  return kernel;
}

}  // namespace

bool scale_fusable(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided &&
         t.scalar_type() == at::kFloat && t.is_contiguous();
}

void scale_fused(const std::vector<at::Tensor>& tensors, double coefficient) {
  std::vector<float*> data;
  std::vector<int64_t> sizes;
  data.reserve(tensors.size());
  sizes.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(scale_fusable(t), "scale_fused: needs contiguous float32 CPU tensors");
    data.push_back(t.data_ptr<float>());
    sizes.push_back(t.numel());
  }
  // float(coefficient): the factor ATen's mul_ by a double scalar multiplies a float32 tensor by.
  scale_cpu_kernel()(data.data(), sizes.data(), static_cast<int64_t>(data.size()),
                     static_cast<float>(coefficient));
  for (const at::Tensor& t : tensors) t.unsafeGetTensorImpl()->bump_version();
}

}  // namespace mixtrain
