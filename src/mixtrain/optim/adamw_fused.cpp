#include "mixtrain/optim/adamw_fused.h"

#if MIXTRAIN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "mixtrain/core/build_info.h"
#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/core/dtype.h"

namespace mixtrain {
namespace {

using Kernel = void (*)(const AdamWStepScalars&, float*, const float*, float*, float*, void*,
                        c10::ScalarType, int64_t);

Kernel cpu_kernel() {
  static const Kernel kernel =
      select_kernel<Kernel>(DEFAULT::adamw_step, AVX2::adamw_step, AVX512::adamw_step);
  return kernel;
}

bool float32_on(const at::Tensor& t, const at::Device& device) {
  return t.defined() && t.device() == device && t.scalar_type() == at::kFloat &&
         t.is_contiguous() && t.layout() == at::kStrided;
}

void bump_versions(const AdamWFusedUpdate& u) {
  for (const at::Tensor* t : {&u.param, &u.exp_avg, &u.exp_avg_sq, &u.model_param}) {
    if (t->defined()) t->unsafeGetTensorImpl()->bump_version();
  }
}

}  // namespace

bool adamw_fusable(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                   const at::Tensor& exp_avg_sq) {
  if (!param.defined()) return false;
  const at::Device device = param.device();
  return (device.is_cpu() || (built_with_cuda() && device.is_cuda())) &&
         float32_on(param, device) && float32_on(grad, device) && float32_on(exp_avg, device) &&
         float32_on(exp_avg_sq, device) && grad.numel() == param.numel() &&
         exp_avg.numel() == param.numel() && exp_avg_sq.numel() == param.numel();
}

bool adamw_fusable_model(const at::Tensor& model, const at::Tensor& param) {
  return model.defined() && model.device() == param.device() && model.is_contiguous() &&
         model.layout() == at::kStrided && model.numel() == param.numel() &&
         is_low_precision(model.scalar_type());
}

void adamw_step_fused(const std::vector<AdamWFusedUpdate>& updates) {
  if (updates.empty()) return;
  const at::Device device = updates.front().param.device();
  for (const AdamWFusedUpdate& u : updates) {
    TORCH_CHECK(
        adamw_fusable(u.param, u.grad, u.exp_avg, u.exp_avg_sq) && u.param.device() == device,
        "adamw_step_fused: every update must be float32 contiguous on ", device);
    TORCH_CHECK(!u.model_param.defined() || adamw_fusable_model(u.model_param, u.param),
                "adamw_step_fused: model param must be a contiguous bfloat16/float16 tensor of "
                "the param's numel on its device");
  }
  if (device.is_cpu()) {
    for (const AdamWFusedUpdate& u : updates) {
      const bool model = u.model_param.defined();
      cpu_kernel()(u.scalars, u.param.data_ptr<float>(), u.grad.data_ptr<float>(),
                   u.exp_avg.data_ptr<float>(), u.exp_avg_sq.data_ptr<float>(),
                   model ? u.model_param.data_ptr() : nullptr,
                   model ? u.model_param.scalar_type() : at::kFloat, u.param.numel());
    }
  } else {
#if MIXTRAIN_WITH_CUDA
    std::vector<CUDA::AdamWTensor> table;
    table.reserve(updates.size());
    for (const AdamWFusedUpdate& u : updates) {
      const bool model = u.model_param.defined();
      table.push_back(
          {u.param.data_ptr<float>(), u.grad.data_ptr<float>(), u.exp_avg.data_ptr<float>(),
           u.exp_avg_sq.data_ptr<float>(), model ? u.model_param.data_ptr() : nullptr,
           model ? u.model_param.scalar_type() : at::kFloat, u.param.numel(), u.scalars});
    }
    const c10::cuda::CUDAGuard guard(device);
    CUDA::adamw_step(table.data(), static_cast<int64_t>(table.size()),
                     c10::cuda::getCurrentCUDAStream(device.index()).stream());
#endif
  }
  // Written through raw pointers: bump the version counters as the in-place ops would, so
  // autograd still notices a graph that saved one of them.
  for (const AdamWFusedUpdate& u : updates) bump_versions(u);
}

}  // namespace mixtrain
