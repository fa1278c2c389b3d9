#include "mixtrain/optim/sum_of_squares_fused.h"

#include <ATen/ATen.h>
#if MIXTRAIN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "mixtrain/core/build_info.h"
#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/core/dtype.h"
#include "mixtrain/optim/kernels/sum_of_squares_kernel.h"

namespace mixtrain {
namespace {

using Kernel = double (*)(const SquaresBuffer*, int64_t);

Kernel cpu_kernel() {
  static const Kernel kernel =
      select_kernel<Kernel>(DEFAULT::sum_of_squares, AVX2::sum_of_squares, AVX512::sum_of_squares);
  return kernel;
}

}  // namespace

bool sum_of_squares_fusable(const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  return t.defined() && t.layout() == at::kStrided &&
         (t.device().is_cpu() || (built_with_cuda() && t.is_cuda())) &&
         (dtype == at::kFloat || is_low_precision(dtype));
}

at::Tensor sum_of_squares_fused(const std::vector<at::Tensor>& tensors, const at::Device& device) {
  std::vector<at::Tensor> contiguous;  // keeps copies of non-contiguous tensors alive
  std::vector<SquaresBuffer> buffers;
  contiguous.reserve(tensors.size());
  buffers.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(sum_of_squares_fusable(t) && t.device() == device,
                "sum_of_squares_fused: every tensor must be float32/bfloat16/float16 on ", device);
    contiguous.push_back(t.contiguous());  // no copy when already contiguous
    buffers.push_back({contiguous.back().data_ptr(), t.numel(), t.scalar_type()});
  }
  const int64_t count = static_cast<int64_t>(buffers.size());
  if (device.is_cpu()) return at::scalar_tensor(cpu_kernel()(buffers.data(), count), at::kDouble);
  TORCH_CHECK(built_with_cuda() && device.is_cuda(), "sum_of_squares_fused: no pass for ", device);
#if MIXTRAIN_WITH_CUDA
  const auto options = at::TensorOptions().dtype(at::kDouble).device(device);
  at::Tensor partials = at::empty({CUDA::sum_of_squares_partials(buffers.data(), count)}, options);
  at::Tensor out = at::empty({}, options);
  const c10::cuda::CUDAGuard guard(device);
  CUDA::sum_of_squares(buffers.data(), count, partials.data_ptr<double>(), out.data_ptr<double>(),
                       c10::cuda::getCurrentCUDAStream(device.index()).stream());
  // partials and the contiguous copies go back to the caching allocator, reused only after this
  // stream's work.
  return out;
#else
  return at::Tensor();  // unreachable: the check above
#endif
}

}  // namespace mixtrain
