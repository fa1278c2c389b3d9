// The scalar AdamW reference of the CUDA tests (support/adamw_reference.h) against the CPU
// kernels it describes, here where no GPU is needed: with ATen's CPU square root (MKL, what the
// kernels call) in place of std::sqrt, the reference is bitwise the AVX2 and AVX-512 kernels
// (param, moments, bfloat16 and float16 model params), for both of lerp's formulas. The CUDA
// tests then compare the device pass with the same reference and its correctly rounded sqrt.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/optim/kernels/adamw_kernel.h"
#include "support/adamw_reference.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using Kernel = void (*)(const AdamWStepScalars&, float*, const float*, float*, float*, void*,
                        c10::ScalarType, int64_t);

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

void expect_reference_is_kernel(Kernel kernel, const AdamWStepScalars& s,
                                at::ScalarType model_dtype) {
  const int64_t n = 100003;  // not a multiple of any vector width: the padded tail too
  const at::Tensor p0 = at::randn({n}), g = at::randn({n}) * 0.1, m0 = at::randn({n}) * 0.01,
                   v0 = at::rand({n}) * 1e-3;
  at::Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
  at::Tensor model = at::empty({n}, model_dtype);
  kernel(s, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
         model.data_ptr(), model_dtype, n);

  std::vector<float> rp(n), rm(n), rv(n);
  for (int64_t i = 0; i < n; ++i) {
    rm[i] = m0.data_ptr<float>()[i];
    rv[i] = v0.data_ptr<float>()[i];
    testing::reference_moments(s, g.data_ptr<float>()[i], rm[i], rv[i]);
  }
  // ATen's sqrt of the whole contiguous tensor: MKL's, as the kernel takes it.
  const at::Tensor roots = at::sqrt(at::from_blob(rv.data(), {n}, at::kFloat));
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    rp[i] = testing::reference_param(s, p0.data_ptr<float>()[i], rm[i], roots.data_ptr<float>()[i]);
    uint16_t got;
    std::memcpy(&got, static_cast<const char*>(model.data_ptr()) + 2 * i, 2);
    const bool same = bits_of(rp[i]) == bits_of(p.data_ptr<float>()[i]) &&
                      bits_of(rm[i]) == bits_of(m.data_ptr<float>()[i]) &&
                      bits_of(rv[i]) == bits_of(v.data_ptr<float>()[i]) &&
                      got == testing::reference_model_bits(rp[i], model_dtype == at::kBFloat16);
    if (!same && mismatches++ < 3) {
      ADD_FAILURE() << "element " << i << ": param " << p.data_ptr<float>()[i] << " reference "
                    << rp[i];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(AdamWReference, BitwiseTheVectorKernelsWithAtenSqrt) {
  std::vector<Kernel> kernels;
  if (hardware_cpu_capability() >= CpuCapability::kAvx2) kernels.push_back(AVX2::adamw_step);
  if (hardware_cpu_capability() >= CpuCapability::kAvx512) kernels.push_back(AVX512::adamw_step);
  if (kernels.empty()) GTEST_SKIP() << "the CPU has no AVX2: no kernel fuses lerp_ / addcmul_";
  at::manual_seed(51);
  for (const Kernel kernel : kernels) {
    // lerp weight 0.1 (first formula) and 0.6 (second), step 1 and 5, both model dtypes
    expect_reference_is_kernel(kernel, testing::reference_scalars(1e-3, 0.9, 0.999, 1e-8, 0.1, 1),
                               at::kBFloat16);
    expect_reference_is_kernel(kernel, testing::reference_scalars(1e-2, 0.4, 0.95, 1e-6, 0.01, 5),
                               at::kHalf);
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
