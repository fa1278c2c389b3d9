#include "mixtrain/optim/widen_add_fused.h"

#if MIXTRAIN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "mixtrain/core/build_info.h"
#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/core/dtype.h"
#include "mixtrain/optim/kernels/widen_add_kernel.h"

namespace mixtrain {
namespace {

using Kernel = void (*)(float*, const void*, c10::ScalarType, int64_t, bool);

Kernel cpu_kernel() {
  static const Kernel kernel =
      select_kernel<Kernel>(DEFAULT::widen_add, AVX2::widen_add, AVX512::widen_add);
  return kernel;
}

bool on_fused_device(const at::Tensor& t) {
  return t.device().is_cpu() || (built_with_cuda() && t.is_cuda());
}

}  // namespace

bool widen_add_fusable(const at::Tensor& dst, const at::Tensor& src) {
  return dst.defined() && src.defined() && on_fused_device(dst) && src.device() == dst.device() &&
         dst.layout() == at::kStrided && src.layout() == at::kStrided && dst.is_contiguous() &&
         src.is_contiguous() && dst.scalar_type() == at::kFloat &&
         is_low_precision(src.scalar_type()) && src.numel() == dst.numel();
}

void widen_add_fused(const at::Tensor& dst, const at::Tensor& src, bool overwrite) {
  TORCH_CHECK(widen_add_fusable(dst, src),
              "widen_add_fused: needs contiguous float32 dst and bfloat16/float16 src of its "
              "numel on one device");
  if (dst.is_cuda()) {
#if MIXTRAIN_WITH_CUDA
    const c10::cuda::CUDAGuard guard(dst.device());
    CUDA::widen_add(dst.data_ptr<float>(), src.data_ptr(), src.scalar_type(), dst.numel(),
                    overwrite, c10::cuda::getCurrentCUDAStream(dst.device().index()).stream());
#endif
  } else {
    cpu_kernel()(dst.data_ptr<float>(), src.data_ptr(), src.scalar_type(), dst.numel(), overwrite);
  }
  dst.unsafeGetTensorImpl()->bump_version();
}

}  // namespace mixtrain
