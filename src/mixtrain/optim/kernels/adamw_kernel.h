// Fused AdamW update of one contiguous float32 tensor: the per-capability kernel variants.
//
// adamw_kernel.cpp is compiled once per capability (docs/architecture.md §1), defining adamw_step
// in namespaces DEFAULT, AVX2 and AVX512; AdamW dispatches with select_kernel()
// (core/cpu_capability.h). Call an AVX2/AVX512 variant only when the CPU supports it.
//
// One pass reads param, grad, exp_avg, exp_avg_sq, writes param, exp_avg, exp_avg_sq and,
// when model_param is not null, param rounded to nearest even into the bfloat16 or float16
// model_param (bitwise what Tensor::to(kBFloat16 / kHalf) gives, NaN payloads aside). Each
// element gets exactly the float operations LibTorch 2.11's CPU kernels of the same capability
// perform for the unfused op sequence (see adamw.h), sqrt included (MKL's, where ATen takes it
// from MKL): so the result is bitwise that sequence's. The work is split into fixed chunks of
// kAdamWChunk elements run by at::parallel_for; the update is elementwise, so the result does
// not depend on the thread count.
//
// CUDA::adamw_step (adamw_kernel.cu) is the device twin: the same per-element float operations
// as the AVX2 / AVX-512 variants (lerp_ and addcmul_ as fused multiply-adds, everything else
// rounded once), with one difference: sqrt is correctly rounded (__fsqrt_rn), where the CPU
// variants take MKL's (about 0.6% of square roots 1 ulp off, see adamw_kernel.cpp). So exp_avg
// and exp_avg_sq are bitwise the CPU's, and param and model_param are bitwise the CPU's wherever
// MKL's square root of the new exp_avg_sq is the correctly rounded one.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace mixtrain {

constexpr int64_t kAdamWChunk = int64_t{1} << 16;

// The scalar operands of one step, each the float ATen's op would see: torch computes them in
// double (Python floats) and the op casts the double Scalar to float.
//
// correctly_rounded_sqrt picks the form: false (the default) is the single-tensor op sequence
// above, sqrt as ATen's (MKL's where ATen takes it from MKL); true is torch.optim.AdamW(fused=True)
// on the CPU (ATen's _fused_adamw_): the same operations with a correctly rounded sqrt
// (Vectorized<float>::sqrt), which lets the CPU variants update each vector in one pass. The
// CUDA twin always takes a correctly rounded sqrt.
struct AdamWStepScalars {
  float decay;                  // 1 - lr * weight_decay          param.mul_
  float exp_avg_weight;         // 1 - beta1                      exp_avg.lerp_ weight
  float beta2;                  //                                exp_avg_sq.mul_
  float one_minus_beta2;        // 1 - beta2                      addcmul_ value
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)           divisor of sqrt(exp_avg_sq)
  float eps;                    //                                add_
  float neg_step_size;          // -lr / (1 - beta1^step)         addcdiv_ value
  bool correctly_rounded_sqrt = false;
};

// model_dtype is kBFloat16 or kHalf when model_param is not null (ignored otherwise).
namespace DEFAULT {
void adamw_step(const AdamWStepScalars& scalars, float* param, const float* grad, float* exp_avg,
                float* exp_avg_sq, void* model_param, c10::ScalarType model_dtype, int64_t numel);
}  // namespace DEFAULT
namespace AVX2 {
void adamw_step(const AdamWStepScalars& scalars, float* param, const float* grad, float* exp_avg,
                float* exp_avg_sq, void* model_param, c10::ScalarType model_dtype, int64_t numel);
}  // namespace AVX2
namespace AVX512 {
void adamw_step(const AdamWStepScalars& scalars, float* param, const float* grad, float* exp_avg,
                float* exp_avg_sq, void* model_param, c10::ScalarType model_dtype, int64_t numel);
}  // namespace AVX512

namespace CUDA {
// One tensor of a multi-tensor launch: device pointers of numel contiguous elements each, and
// its step's scalars (tensors of one launch may have different step counts and groups).
struct AdamWTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  void* model_param;  // null: none; else model_dtype (kBFloat16 or kHalf) on the same device
  c10::ScalarType model_dtype;
  int64_t numel;
  AdamWStepScalars scalars;
};
// Enqueues the update of every tensor of the list on `stream` (a cudaStream_t of the tensors'
// device, the current device) and returns without waiting: one kernel launch per
// kAdamWLaunchTensors tensors (fewer when the list has more than kAdamWLaunchScalars distinct
// scalar sets), grid over (tensor, chunk of kAdamWCudaChunk elements). Tensors of numel 0 are
// skipped. Throws std::invalid_argument for a bad model dtype or negative numel and
// std::runtime_error when a launch fails.
constexpr int kAdamWLaunchTensors = 48;
constexpr int kAdamWLaunchScalars = 4;
constexpr int64_t kAdamWCudaChunk = int64_t{1} << 13;
void adamw_step(const AdamWTensor* tensors, int64_t count, void* stream);
}  // namespace CUDA

}  // namespace mixtrain
