#include "mixtrain/optim/muon_fused.h"

#if MIXTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "mixtrain/optim/kernels/muon_kernel_cuda.h"
#endif

#include "mixtrain/core/build_info.h"
#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/core/dtype.h"

namespace mixtrain {
namespace {

using MomentumKernel = void (*)(const MuonMomentumScalars&, float*, const void*, c10::ScalarType,
                                void*, c10::ScalarType, int64_t);
using ApplyKernel = void (*)(const MuonApplyScalars&, float*, const void*, c10::ScalarType, void*,
                             c10::ScalarType, int64_t);

MomentumKernel cpu_momentum_kernel() {
  static const MomentumKernel kernel = select_kernel<MomentumKernel>(
      DEFAULT::muon_momentum, AVX2::muon_momentum, AVX512::muon_momentum);
  return kernel;
}

ApplyKernel cpu_apply_kernel() {
  static const ApplyKernel kernel =
      select_kernel<ApplyKernel>(DEFAULT::muon_apply, AVX2::muon_apply, AVX512::muon_apply);
  return kernel;
}

}  // namespace

bool muon_fusable(const at::Tensor& t, bool float32_only, c10::Device device) {
  const auto dtype = t.scalar_type();
  return (device.is_cpu() || (built_with_cuda() && device.is_cuda())) && t.device() == device &&
         t.layout() == at::kStrided && t.is_contiguous() &&
         (dtype == at::kFloat || (!float32_only && is_low_precision(dtype)));
}

void muon_momentum_fused(const MuonMomentumScalars& s, const at::Tensor& buffer,
                         const at::Tensor& grad, const at::Tensor& out) {
  TORCH_CHECK(muon_fusable(buffer, true, buffer.device()) &&
                  muon_fusable(grad, false, buffer.device()) &&
                  muon_fusable(out, false, buffer.device()) && grad.numel() == buffer.numel() &&
                  out.numel() == buffer.numel(),
              "muon_momentum_fused: tensors the fused pass does not take");
  if (buffer.is_cuda()) {
#if MIXTRAIN_WITH_CUDA
    const c10::cuda::CUDAGuard guard(buffer.device());
    CUDA::muon_momentum(s, buffer.data_ptr<float>(), grad.data_ptr(), grad.scalar_type(),
                        out.data_ptr(), out.scalar_type(), out.numel(),
                        at::cuda::getCurrentCUDAStream(buffer.device().index()));
#endif
  } else {
    cpu_momentum_kernel()(s, buffer.data_ptr<float>(), grad.data_ptr(), grad.scalar_type(),
                          out.data_ptr(), out.scalar_type(), out.numel());
  }
  // Written through raw pointers: bump the version counters as the in-place ops would.
  buffer.unsafeGetTensorImpl()->bump_version();
  out.unsafeGetTensorImpl()->bump_version();
}

void muon_apply_fused(const MuonApplyScalars& s, const at::Tensor& param, const at::Tensor& update,
                      const at::Tensor& model) {
  TORCH_CHECK(muon_fusable(param, true, param.device()) &&
                  muon_fusable(update, false, param.device()) && update.numel() == param.numel() &&
                  (!model.defined() ||
                   (muon_fusable(model, false, param.device()) &&
                    model.scalar_type() != at::kFloat && model.numel() == param.numel())),
              "muon_apply_fused: tensors the fused pass does not take");
  void* model_ptr = model.defined() ? model.data_ptr() : nullptr;
  const auto model_dtype = model.defined() ? model.scalar_type() : at::kFloat;
  if (param.is_cuda()) {
#if MIXTRAIN_WITH_CUDA
    const c10::cuda::CUDAGuard guard(param.device());
    CUDA::muon_apply(s, param.data_ptr<float>(), update.data_ptr(), update.scalar_type(), model_ptr,
                     model_dtype, param.numel(),
                     at::cuda::getCurrentCUDAStream(param.device().index()));
#endif
  } else {
    cpu_apply_kernel()(s, param.data_ptr<float>(), update.data_ptr(), update.scalar_type(),
                       model_ptr, model_dtype, param.numel());
  }
  param.unsafeGetTensorImpl()->bump_version();
  if (model.defined()) model.unsafeGetTensorImpl()->bump_version();
}

}  // namespace mixtrain
