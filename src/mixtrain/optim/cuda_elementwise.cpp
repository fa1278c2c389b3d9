#include "mixtrain/optim/cuda_elementwise.h"

#include <ATen/ATen.h>
#if MIXTRAIN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "mixtrain/core/dtype.h"
#include "mixtrain/optim/kernels/sum_of_squares_kernel.h"
#include "mixtrain/optim/kernels/widen_add_kernel.h"

namespace mixtrain {
namespace {

bool float_on_cuda(const at::Tensor& t) {
  return t.defined() && t.is_cuda() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
         t.layout() == at::kStrided;
}

#if MIXTRAIN_WITH_CUDA
void* current_stream(const at::Device& device) {
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
}
#else
// A CPU-only build has no CUDA tensors, so every call fails its argument check first.
[[noreturn]] void cpu_only_build(const char* op) {
  TORCH_CHECK(false, op, ": this mixtrain build is CPU-only (no CUDA kernels)");
}
#endif

}  // namespace

bool adamw_cuda_fusable(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                        const at::Tensor& exp_avg_sq) {
  return float_on_cuda(param) && float_on_cuda(grad) && float_on_cuda(exp_avg) &&
         float_on_cuda(exp_avg_sq) && grad.device() == param.device() &&
         exp_avg.device() == param.device() && exp_avg_sq.device() == param.device() &&
         grad.numel() == param.numel() && exp_avg.numel() == param.numel() &&
         exp_avg_sq.numel() == param.numel();
}

bool adamw_cuda_fusable_model(const at::Tensor& model, const at::Tensor& param) {
  return model.defined() && model.device() == param.device() && model.is_contiguous() &&
         model.layout() == at::kStrided && model.numel() == param.numel() &&
         is_low_precision(model.scalar_type());
}

void adamw_step_cuda(const std::vector<AdamWCudaUpdate>& updates) {
  if (updates.empty()) return;
  const at::Device device = updates.front().param.device();
  std::vector<CUDA::AdamWTensor> table;
  table.reserve(updates.size());
  for (const AdamWCudaUpdate& u : updates) {
    TORCH_CHECK(
        adamw_cuda_fusable(u.param, u.grad, u.exp_avg, u.exp_avg_sq) && u.param.device() == device,
        "adamw_step_cuda: every update must be float32 contiguous on ", device);
    const bool model = u.model_param.defined();
    TORCH_CHECK(!model || adamw_cuda_fusable_model(u.model_param, u.param),
                "adamw_step_cuda: model param must be a contiguous bfloat16/float16 tensor of "
                "the param's numel on its device");
    table.push_back({u.param.data_ptr<float>(), u.grad.data_ptr<float>(),
                     u.exp_avg.data_ptr<float>(), u.exp_avg_sq.data_ptr<float>(),
                     model ? u.model_param.data_ptr() : nullptr,
                     model ? u.model_param.scalar_type() : at::kFloat, u.param.numel(), u.scalars});
  }
#if MIXTRAIN_WITH_CUDA
  const c10::cuda::CUDAGuard guard(device);
  CUDA::adamw_step(table.data(), static_cast<int64_t>(table.size()), current_stream(device));
#else
  cpu_only_build("adamw_step_cuda");
#endif
}

at::Tensor sum_of_squares_cuda(const std::vector<at::Tensor>& tensors, const at::Device& device) {
  TORCH_CHECK(device.is_cuda(), "sum_of_squares_cuda: ", device, " is not a CUDA device");
  std::vector<SquaresBuffer> buffers;
  buffers.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.device() == device && t.is_contiguous() &&
                    (t.scalar_type() == at::kFloat || is_low_precision(t.scalar_type())),
                "sum_of_squares_cuda: every tensor must be contiguous float32/bfloat16/float16 "
                "on ",
                device);
    buffers.push_back({t.data_ptr(), t.numel(), t.scalar_type()});
  }
#if MIXTRAIN_WITH_CUDA
  const auto options = at::TensorOptions().dtype(at::kDouble).device(device);
  const int64_t count = static_cast<int64_t>(buffers.size());
  at::Tensor partials = at::empty({CUDA::sum_of_squares_partials(buffers.data(), count)}, options);
  at::Tensor out = at::empty({}, options);
  const c10::cuda::CUDAGuard guard(device);
  CUDA::sum_of_squares(buffers.data(), count, partials.data_ptr<double>(), out.data_ptr<double>(),
                       current_stream(device));
  return out;  // partials go back to the caching allocator, reused only after this stream's work
#else
  cpu_only_build("sum_of_squares_cuda");
#endif
}

void widen_add_cuda(const at::Tensor& dst, const at::Tensor& src, bool overwrite) {
  TORCH_CHECK(float_on_cuda(dst) && src.device() == dst.device() && src.is_contiguous() &&
                  is_low_precision(src.scalar_type()) && src.numel() == dst.numel(),
              "widen_add_cuda: needs contiguous float32 dst and bfloat16/float16 src of its "
              "numel on one CUDA device");
#if MIXTRAIN_WITH_CUDA
  const c10::cuda::CUDAGuard guard(dst.device());
  CUDA::widen_add(dst.data_ptr<float>(), src.data_ptr(), src.scalar_type(), dst.numel(), overwrite,
                  current_stream(dst.device()));
#else
  (void)overwrite;
  cpu_only_build("widen_add_cuda");
#endif
}

}  // namespace mixtrain
