// CUDA::adamw_step (optim/kernels/adamw_kernel.h), the multi-tensor CUDA AdamW pass:
// - bitwise equal to the scalar reference (support/adamw_reference.h: the AVX2 / AVX-512
//   kernels' operations with a correctly rounded sqrt) for param, exp_avg, exp_avg_sq and the
//   bfloat16 / float16 model param, over many tensors of different sizes in one call (tails not a
//   multiple of 4 or of the chunk, empty tensors, a misaligned tensor on the scalar path, more
//   tensors and scalar sets than one launch takes, both lerp formulas);
// - against the CPU kernel the process would use (AVX2 or AVX-512 where the CPU has them):
//   moments bitwise; param and model bitwise on every element whose MKL square root (ATen's CPU
//   sqrt, which the CPU kernel calls) equals the correctly rounded one, and within the bound
//   derived below on the others.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/optim/kernels/adamw_kernel.h"
#include "support/adamw_reference.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::reference_element;
using testing::reference_model_bits;
using testing::reference_scalars;

// One tensor's inputs on the CPU and its device copies.
struct Case {
  int64_t numel;
  at::ScalarType model_dtype;  // kFloat: no model param
  AdamWStepScalars scalars;
  at::Tensor p, g, m, v;              // CPU float32 inputs
  at::Tensor dp, dg, dm, dv, dmodel;  // device tensors the kernel updates
  at::Tensor p_storage;               // device buffer dp is a view of (misaligned case)
};

Case make_case(int64_t numel, at::ScalarType model_dtype, const AdamWStepScalars& scalars,
               bool misaligned) {
  Case c;
  c.numel = numel;
  c.model_dtype = model_dtype;
  c.scalars = scalars;
  c.p = at::randn({numel});
  c.g = at::randn({numel}) * 0.1;
  c.m = at::randn({numel}) * 0.01;
  c.v = at::rand({numel}) * 1e-3;  // a second moment is >= 0
  if (misaligned) {
    // param one float past a 16-byte boundary: the whole tensor takes the scalar path
    c.p_storage = at::empty({numel + 1}, at::TensorOptions().device(at::kCUDA));
    c.dp = c.p_storage.narrow(0, 1, numel);
    c.dp.copy_(c.p);
  } else {
    c.dp = c.p.to(at::kCUDA);
  }
  c.dg = c.g.to(at::kCUDA);
  c.dm = c.m.to(at::kCUDA);
  c.dv = c.v.to(at::kCUDA);
  if (model_dtype != at::kFloat) {
    c.dmodel = at::full({numel}, 7.0, at::TensorOptions().dtype(model_dtype).device(at::kCUDA));
  }
  return c;
}

CUDA::AdamWTensor table_entry(Case& c) {
  const bool model = c.model_dtype != at::kFloat;
  return {c.dp.data_ptr<float>(),
          c.dg.data_ptr<float>(),
          c.dm.data_ptr<float>(),
          c.dv.data_ptr<float>(),
          model ? c.dmodel.data_ptr() : nullptr,
          model ? c.model_dtype : at::kFloat,
          c.numel,
          c.scalars};
}

void run_kernel(std::vector<Case>& cases) {
  std::vector<CUDA::AdamWTensor> table;
  for (Case& c : cases) table.push_back(table_entry(c));
  CUDA::adamw_step(table.data(), static_cast<int64_t>(table.size()),
                   c10::cuda::getCurrentCUDAStream().stream());
}

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// Sizes around the float4 width (4), the chunk (kAdamWCudaChunk = 8192) and larger.
std::vector<int64_t> sizes() {
  return {0, 1, 3, 4, 7, 33, 1000, 8191, 8192, 8193, 3 * 8192 + 5, 100003, 0, 2};
}

// Runs the kernel on `cases` in one call and compares every element with the reference.
void expect_bitwise_reference(std::vector<Case>& cases) {
  run_kernel(cases);
  for (size_t k = 0; k < cases.size(); ++k) {
    Case& c = cases[k];
    const at::Tensor p = c.dp.cpu(), m = c.dm.cpu(), v = c.dv.cpu();
    const at::Tensor model = c.model_dtype != at::kFloat ? c.dmodel.cpu() : at::Tensor();
    int64_t mismatches = 0;
    for (int64_t i = 0; i < c.numel; ++i) {
      float rp = c.p.data_ptr<float>()[i], rm = c.m.data_ptr<float>()[i],
            rv = c.v.data_ptr<float>()[i];
      reference_element(c.scalars, rp, c.g.data_ptr<float>()[i], rm, rv);
      bool same = bits_of(rp) == bits_of(p.data_ptr<float>()[i]) &&
                  bits_of(rm) == bits_of(m.data_ptr<float>()[i]) &&
                  bits_of(rv) == bits_of(v.data_ptr<float>()[i]);
      if (model.defined()) {
        uint16_t got;
        std::memcpy(&got, static_cast<const char*>(model.data_ptr()) + 2 * i, 2);
        same = same && got == reference_model_bits(rp, c.model_dtype == at::kBFloat16);
      }
      if (!same && mismatches++ < 3) {
        ADD_FAILURE() << "tensor " << k << " (numel " << c.numel << ") element " << i << ": param "
                      << p.data_ptr<float>()[i] << " vs reference " << rp;
      }
    }
    EXPECT_EQ(mismatches, 0) << "tensor " << k << " of numel " << c.numel;
  }
}

// rounds x 14 tensors of the sizes above, bfloat16, float16 and no model params, every
// fifth one misaligned; scalar set k of tensor k cycles through `sets`.
std::vector<Case> many_cases(const std::vector<AdamWStepScalars>& sets, int rounds) {
  const at::ScalarType models[] = {at::kBFloat16, at::kHalf, at::kFloat};
  std::vector<Case> cases;
  const std::vector<int64_t> n = sizes();
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < n.size(); ++i) {
      const size_t k = round * n.size() + i;
      cases.push_back(make_case(n[i], models[(k / 2) % 3], sets[k % sets.size()],
                                /*misaligned=*/k % 5 == 3 && n[i] > 0));
    }
  }
  return cases;
}

TEST(AdamWKernelCuda, BitwiseEqualToTheScalarReferenceAcrossManyTensors) {
  at::manual_seed(11);
  // Six scalar sets, more than one launch takes (kAdamWLaunchScalars = 4), cycling: the call is
  // split by scalar sets. Step counts 1..7, weight decays 0..0.2, and beta1 = 0.4 (lerp weight
  // 0.6 >= 0.5: ATen's second formula).
  const std::vector<AdamWStepScalars> sets = {reference_scalars(1e-3, 0.9, 0.999, 1e-8, 0.1, 1),
                                              reference_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, 2),
                                              reference_scalars(3e-4, 0.9, 0.95, 1e-8, 0.01, 3),
                                              reference_scalars(1e-2, 0.4, 0.99, 1e-6, 0.1, 1),
                                              reference_scalars(1e-3, 0.8, 0.999, 1e-8, 0.1, 7),
                                              reference_scalars(5e-3, 0.95, 0.98, 1e-5, 0.2, 2)};
  std::vector<Case> cycling = many_cases(sets, 5);
  expect_bitwise_reference(cycling);
  // One scalar set for 70 tensors, more than one launch takes (kAdamWLaunchTensors = 48): the
  // call is split by tensor count.
  std::vector<Case> one_set = many_cases({sets[3]}, 5);
  ASSERT_GT(one_set.size(), static_cast<size_t>(CUDA::kAdamWLaunchTensors));
  expect_bitwise_reference(one_set);
}

TEST(AdamWKernelCuda, MatchesTheCpuKernelExceptWhereMklSqrtIsNotCorrectlyRounded) {
  if (hardware_cpu_capability() < CpuCapability::kAvx2) {
    GTEST_SKIP() << "the CPU has no AVX2: its DEFAULT kernel does not fuse lerp_ / addcmul_";
  }
  using Kernel = void (*)(const AdamWStepScalars&, float*, const float*, float*, float*, void*,
                          c10::ScalarType, int64_t);
  const Kernel cpu =
      hardware_cpu_capability() == CpuCapability::kAvx512 ? AVX512::adamw_step : AVX2::adamw_step;
  at::manual_seed(12);
  const AdamWStepScalars s = reference_scalars(1e-3, 0.9, 0.999, 1e-8, 0.1, 3);
  const int64_t n = 1 << 20;
  std::vector<Case> cases = {make_case(n, at::kBFloat16, s, false)};
  Case& c = cases[0];
  run_kernel(cases);
  at::Tensor cp = c.p.clone(), cm = c.m.clone(), cv = c.v.clone();
  at::Tensor cmodel = at::empty({n}, at::kBFloat16);
  cpu(s, cp.data_ptr<float>(), c.g.data_ptr<float>(), cm.data_ptr<float>(), cv.data_ptr<float>(),
      cmodel.data_ptr(), at::kBFloat16, n);

  // The moments involve no square root: bitwise.
  const at::Tensor gm = c.dm.cpu(), gv = c.dv.cpu();
  EXPECT_EQ(std::memcmp(gm.data_ptr(), cm.data_ptr(), cm.nbytes()), 0);
  EXPECT_EQ(std::memcmp(gv.data_ptr(), cv.data_ptr(), cv.nbytes()), 0);
  // ATen's CPU sqrt (MKL, what the CPU kernel calls) against the correctly rounded one.
  const at::Tensor mkl_root = at::sqrt(cv);
  const at::Tensor gp = c.dp.cpu(), gmodel = c.dmodel.cpu();
  int64_t root_differs = 0, bitwise_failures = 0, bound_failures = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = cv.data_ptr<float>()[i];
    const float gpu_p = gp.data_ptr<float>()[i], cpu_p = cp.data_ptr<float>()[i];
    if (mkl_root.data_ptr<float>()[i] == std::sqrt(v)) {
      const bool same = bits_of(gpu_p) == bits_of(cpu_p) &&
                        std::memcmp(static_cast<const char*>(gmodel.data_ptr()) + 2 * i,
                                    static_cast<const char*>(cmodel.data_ptr()) + 2 * i, 2) == 0;
      bitwise_failures += same ? 0 : 1;
      continue;
    }
    ++root_differs;
    // MKL's root is within 1 ulp (relative 2^-23) of the rounded one. Through the division by
    // sqrt(bc2), the + eps (a positive term: it only shrinks a relative difference) and the
    // division of -step * m by the denominator, with one rounding each (2^-24 relative) on both
    // sides, the update u = -step * m / denom differs by at most (2^-23 + 6 * 2^-24) |u| =
    // 2^-21 |u| to first order; 2^-20 covers the second-order terms and u taken here in double.
    // p = decayed + u then adds its rounding on each side, half an ulp of p each.
    const double u = static_cast<double>(s.neg_step_size) * cm.data_ptr<float>()[i] /
                     (std::sqrt(static_cast<double>(v)) / s.bias_correction2_sqrt + s.eps);
    const float larger = std::max(std::fabs(gpu_p), std::fabs(cpu_p));
    const double ulp_p = std::nextafter(larger, std::numeric_limits<float>::infinity()) - larger;
    const double bound = std::ldexp(std::fabs(u), -20) + ulp_p;
    if (std::fabs(static_cast<double>(gpu_p) - cpu_p) > bound) ++bound_failures;
  }
  EXPECT_EQ(bitwise_failures, 0);
  EXPECT_EQ(bound_failures, 0);
  // MKL's high-accuracy sqrt is off for about 0.6% of inputs: some, not most, differ.
  EXPECT_LT(root_differs, n / 20);
}

TEST(AdamWKernelCuda, EmptyListAndEmptyTensorsLaunchNothing) {
  CUDA::adamw_step(nullptr, 0, c10::cuda::getCurrentCUDAStream().stream());
  std::vector<Case> cases = {
      make_case(0, at::kBFloat16, reference_scalars(1e-3, 0.9, 0.999, 1e-8, 0.1, 1), false)};
  run_kernel(cases);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(AdamWKernelCuda, RejectsAnotherModelDtype) {
  at::Tensor p = at::zeros({4}, at::TensorOptions().device(at::kCUDA));
  at::Tensor model = at::zeros({4}, at::TensorOptions().device(at::kCUDA).dtype(at::kDouble));
  const CUDA::AdamWTensor t = {p.data_ptr<float>(),
                               p.data_ptr<float>(),
                               p.data_ptr<float>(),
                               p.data_ptr<float>(),
                               model.data_ptr(),
                               at::kDouble,
                               4,
                               reference_scalars(1e-3, 0.9, 0.999, 1e-8, 0, 1)};
  EXPECT_THROW(CUDA::adamw_step(&t, 1, c10::cuda::getCurrentCUDAStream().stream()),
               std::invalid_argument);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
