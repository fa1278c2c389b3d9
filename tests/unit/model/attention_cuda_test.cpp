// causal_attention on a CUDA device (label cuda; skipped without one): kFlash, the model's
// kernel there (at::scaled_dot_product_attention: LibTorch's fused flash, cuDNN or
// memory-efficient kernel), against the float64 reference of support/attention_reference.h and
// against the math path on the same device, in bfloat16 and float16 (the model dtypes; float32
// takes SDPA's memory-efficient kernel, whose TF32 use is LibTorch's choice), output and the
// gradients of q, k and v.
// Bounds: the fused kernels accumulate the scores, the softmax and both GEMMs in float32 and
// round dS and the gradients at most as often as LibTorch's CPU flash kernel, whose bound
// (tolerance_of(kFlash)) therefore holds for them. The math path on CUDA rounds as on the CPU,
// except that cuBLAS may reduce split-K partial sums of bfloat16/float16 GEMMs in the compute
// dtype (torch's allow_bf16/fp16_reduced_precision_reduction, on by default): one more rounding
// per GEMM, so its bound is tolerance_of(kMath) plus one u per GEMM on each path (3 u).
// Parity of the two: by the triangle inequality, within the sum of their bounds.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>

#include <cstdio>
#include <string>

#include "mixtrain/model/attention.h"
#include "support/attention_reference.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using namespace test_support;  // NOLINT: the reference's many names

const c10::Device kGpu(c10::kCUDA, 0);

// The kernel's results, back on the host.
Result run_on_gpu(AttentionKernel kernel, const Inputs& in) {
  const auto q = in.q.to(kGpu).detach().requires_grad_(),
             k = in.k.to(kGpu).detach().requires_grad_(),
             v = in.v.to(kGpu).detach().requires_grad_();
  const auto out = causal_attention(q, k, v, kernel);
  if (kernel == AttentionKernel::kFlash) {
    // A fused kernel, not SDPA's math fallback.
    const std::string name = out.grad_fn()->name();
    EXPECT_TRUE(name.find("Flash") != std::string::npos ||
                name.find("Cudnn") != std::string::npos ||
                name.find("Efficient") != std::string::npos)
        << name;
  }
  out.backward(in.dout.to(kGpu));
  return {out.detach().cpu(), q.grad().cpu(), k.grad().cpu(), v.grad().cpu()};
}

double diff(const at::Tensor& a, const at::Tensor& b, const at::Tensor& magnitude) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
         magnitude.max().item<double>();
}

class AttentionCuda : public ::testing::TestWithParam<torch::ScalarType> {};

TEST_P(AttentionCuda, FusedKernelMatchesTheReferenceAndTheMathPath) {
  const auto dtype = GetParam();
  EXPECT_EQ(attention_kernel_for(dtype, kGpu), AttentionKernel::kFlash);
  const double u = unit_roundoff(dtype);
  uint64_t seed = 11;
  // head_dim 16 and 64 (the fused kernels' common sizes), grouped-query, odd lengths.
  for (const Shape& shape : {Shape{2, 4, 2, 33, 16}, Shape{1, 8, 2, 130, 64}}) {
    for (double score_scale : {1.0, 3.0}) {
      const Inputs in = make_inputs(shape, dtype, score_scale, seed++);
      const Reference ref = reference_attention(in);
      const Result fused = run_on_gpu(AttentionKernel::kFlash, in);
      const Result math = run_on_gpu(AttentionKernel::kMath, in);
      ASSERT_EQ(fused.out.scalar_type(), dtype);
      Tolerance tf = tolerance_of(AttentionKernel::kFlash, shape, u, ref.sigma);
      Tolerance tm = tolerance_of(AttentionKernel::kMath, shape, u, ref.sigma);
      for (double* t : {&tm.out, &tm.dq, &tm.dk, &tm.dv}) *t += 3 * u;
      const std::string where = std::string(c10::toString(dtype)) +
                                " S=" + std::to_string(shape.seq) +
                                " D=" + std::to_string(shape.head_dim) + " scores x" +
                                std::to_string(int(score_scale * score_scale));
      const double f_out = error(fused.out, ref.value.out, ref.magnitude.out);
      const double f_dq = error(fused.dq, ref.value.dq, ref.magnitude.dq);
      const double f_dk = error(fused.dk, ref.value.dk, ref.magnitude.dk);
      const double f_dv = error(fused.dv, ref.value.dv, ref.magnitude.dv);
      std::printf(
          "%-28s fused (in u): out %6.2f (%6.1f) dq %6.2f (%6.1f) dk %6.2f (%6.1f) "
          "dv %6.2f (%6.1f)\n",
          where.c_str(), f_out / u, tf.out / u, f_dq / u, tf.dq / u, f_dk / u, tf.dk / u, f_dv / u,
          tf.dv / u);
      EXPECT_LE(f_out, tf.out) << where;
      EXPECT_LE(f_dq, tf.dq) << where;
      EXPECT_LE(f_dk, tf.dk) << where;
      EXPECT_LE(f_dv, tf.dv) << where;
      EXPECT_LE(error(math.out, ref.value.out, ref.magnitude.out), tm.out) << where;
      EXPECT_LE(error(math.dq, ref.value.dq, ref.magnitude.dq), tm.dq) << where;
      // Parity with the math path.
      EXPECT_LE(diff(fused.out, math.out, ref.magnitude.out), tf.out + tm.out) << where;
      EXPECT_LE(diff(fused.dq, math.dq, ref.magnitude.dq), tf.dq + tm.dq) << where;
      EXPECT_LE(diff(fused.dk, math.dk, ref.magnitude.dk), tf.dk + tm.dk) << where;
      EXPECT_LE(diff(fused.dv, math.dv, ref.magnitude.dv), tf.dv + tm.dv) << where;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionCuda, ::testing::Values(torch::kBFloat16, torch::kHalf),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
