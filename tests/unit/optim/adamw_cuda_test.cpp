// mixtrain::AdamW on CUDA tensors (optim/adamw.h, CUDA path): the step's float32 CUDA params go
// through the multi-tensor pass, bitwise equal over three steps to the scalar reference
// (support/adamw_reference.h), two param groups, bfloat16 and float16 copy-back targets, a
// param without grad left alone, an empty param; a copy-back target the pass cannot write
// (non-contiguous) gets model.copy_(param) after it; against the same optimizer on CPU tensors,
// moments bitwise and params as adamw_kernel_cuda_test derives.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/optim/adamw.h"
#include "support/adamw_reference.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::reference_element;
using testing::reference_model_bits;
using testing::reference_scalars;
using torch::optim::AdamWOptions;
using torch::optim::OptimizerParamGroup;

constexpr double kLr = 2e-3, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8;

AdamWOptions options(double weight_decay) {
  return AdamWOptions(kLr).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(weight_decay);
}

// Same dtype, shape and bytes (at::equal compares values: -0 == 0).
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ca = a.contiguous().cpu(), cb = b.contiguous().cpu();
  return ca.scalar_type() == cb.scalar_type() && ca.sizes() == cb.sizes() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

TEST(AdamWCuda, StepsAreBitwiseTheReferenceWithCopyBack) {
  at::manual_seed(21);
  const std::vector<int64_t> sizes = {5, 8192 + 3, 0, 40001, 17, 1 << 16};
  const double decays[] = {0.1, 0.0};
  std::vector<at::Tensor> cpu_params, params, models;
  std::vector<at::ScalarType> model_dtypes;
  std::vector<OptimizerParamGroup> groups;
  std::vector<at::Tensor> group_params[2];
  for (size_t i = 0; i < sizes.size(); ++i) {
    cpu_params.push_back(at::randn({sizes[i]}));
    params.push_back(cpu_params.back().to(at::kCUDA).requires_grad_(true));
    model_dtypes.push_back(i % 2 == 0 ? at::kBFloat16 : at::kHalf);
    models.push_back(at::zeros({sizes[i]}, params.back().options().dtype(model_dtypes.back())));
    group_params[i % 2].push_back(params.back());
  }
  at::Tensor no_grad = at::ones({9}, at::TensorOptions().device(at::kCUDA)).requires_grad_(true);
  group_params[0].push_back(no_grad);
  groups.emplace_back(group_params[0], std::make_unique<AdamWOptions>(options(decays[0])));
  groups.emplace_back(group_params[1], std::make_unique<AdamWOptions>(options(decays[1])));
  AdamW optimizer(std::move(groups), options(0.0));
  for (size_t i = 0; i < params.size(); ++i) optimizer.set_copy_back(params[i], models[i]);

  // The reference's state, on the CPU.
  std::vector<at::Tensor> ref_p, ref_m, ref_v;
  for (const auto& p : cpu_params) {
    ref_p.push_back(p.clone());
    ref_m.push_back(at::zeros_like(p));
    ref_v.push_back(at::zeros_like(p));
  }
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < params.size(); ++i) {
      grads.push_back(at::randn({sizes[i]}) * 0.05);
      params[i].mutable_grad() = grads.back().to(at::kCUDA);
    }
    const int64_t no_grad_version = no_grad._version();
    optimizer.step();
    EXPECT_EQ(no_grad._version(), no_grad_version);
    for (size_t i = 0; i < params.size(); ++i) {
      const AdamWStepScalars s = reference_scalars(kLr, kBeta1, kBeta2, kEps, decays[i % 2], step);
      float* p = ref_p[i].data_ptr<float>();
      float* m = ref_m[i].data_ptr<float>();
      float* v = ref_v[i].data_ptr<float>();
      for (int64_t k = 0; k < sizes[i]; ++k)
        reference_element(s, p[k], grads[i].data_ptr<float>()[k], m[k], v[k]);
      const NamedTensorList state = optimizer.export_state(params[i]);
      ASSERT_EQ(state.size(), 3u);
      EXPECT_TRUE(same_bits(params[i].detach(), ref_p[i])) << "param " << i << " step " << step;
      EXPECT_TRUE(same_bits(state[0].second, ref_m[i])) << "exp_avg " << i;
      EXPECT_TRUE(same_bits(state[1].second, ref_v[i])) << "exp_avg_sq " << i;
      EXPECT_EQ(state[2].second.item<int64_t>(), step);
      const at::Tensor model = models[i].cpu();
      int64_t model_mismatches = 0;
      for (int64_t k = 0; k < sizes[i]; ++k) {
        uint16_t got;
        std::memcpy(&got, static_cast<const char*>(model.data_ptr()) + 2 * k, 2);
        model_mismatches += got != reference_model_bits(p[k], model_dtypes[i] == at::kBFloat16);
      }
      EXPECT_EQ(model_mismatches, 0) << "model " << i;
    }
  }
}

TEST(AdamWCuda, NonContiguousCopyBackTargetIsCopiedAfterThePass) {
  at::manual_seed(22);
  at::Tensor param =
      at::randn({64, 33}, at::TensorOptions().device(at::kCUDA)).requires_grad_(true);
  // A transposed view: not contiguous, so the pass cannot write it.
  at::Tensor storage = at::zeros({33, 64}, param.options().dtype(at::kBFloat16));
  at::Tensor model = storage.t();
  ASSERT_FALSE(model.is_contiguous());
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{param}, std::make_unique<AdamWOptions>(options(0.1)));
  AdamW optimizer(std::move(groups), options(0.1));
  optimizer.set_copy_back(param, model);
  param.mutable_grad() = at::randn({64, 33}, param.options()) * 0.1;
  const at::Tensor before = param.detach().clone();
  optimizer.step();
  EXPECT_FALSE(at::equal(param.detach(), before));
  EXPECT_TRUE(same_bits(model, param.detach().to(at::kBFloat16)));
}

TEST(AdamWCuda, AgreesWithTheCpuOptimizer) {
  if (cpu_capability() < CpuCapability::kAvx2) {
    GTEST_SKIP() << "the CPU kernel in use is DEFAULT: it does not fuse lerp_ / addcmul_";
  }
  at::manual_seed(23);
  const std::vector<int64_t> sizes = {3, 4099, 70000};
  std::vector<at::Tensor> cpu_params, cuda_params;
  for (const int64_t n : sizes) {
    cpu_params.push_back(at::randn({n}).requires_grad_(true));
    cuda_params.push_back(cpu_params.back().detach().to(at::kCUDA).requires_grad_(true));
  }
  std::vector<OptimizerParamGroup> cpu_groups, cuda_groups;
  cpu_groups.emplace_back(cpu_params, std::make_unique<AdamWOptions>(options(0.1)));
  cuda_groups.emplace_back(cuda_params, std::make_unique<AdamWOptions>(options(0.1)));
  AdamW cpu(std::move(cpu_groups), options(0.1)), cuda(std::move(cuda_groups), options(0.1));
  for (size_t i = 0; i < sizes.size(); ++i) {
    const at::Tensor g = at::randn({sizes[i]}) * 0.05;
    cpu_params[i].mutable_grad() = g;
    cuda_params[i].mutable_grad() = g.to(at::kCUDA);
  }
  cpu.step();
  cuda.step();
  const AdamWStepScalars s = reference_scalars(kLr, kBeta1, kBeta2, kEps, 0.1, 1);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const NamedTensorList cs = cpu.export_state(cpu_params[i]);
    const NamedTensorList gs = cuda.export_state(cuda_params[i]);
    // The moments involve no square root: bitwise.
    EXPECT_TRUE(same_bits(cs[0].second, gs[0].second));
    EXPECT_TRUE(same_bits(cs[1].second, gs[1].second));
    // Params: bitwise where ATen's CPU sqrt (MKL) is the correctly rounded root; elsewhere within
    // 2^-20 |u| + 1 ulp of p (adamw_kernel_cuda_test derives it).
    const at::Tensor v = cs[1].second, m = cs[0].second, root = at::sqrt(v);
    const at::Tensor pc = cpu_params[i].detach(), pg = cuda_params[i].detach().cpu();
    int64_t failures = 0;
    for (int64_t k = 0; k < sizes[i]; ++k) {
      const float a = pc.data_ptr<float>()[k], b = pg.data_ptr<float>()[k];
      const float vk = v.data_ptr<float>()[k];
      if (root.data_ptr<float>()[k] == std::sqrt(vk)) {
        failures += bits_of(a) != bits_of(b);
        continue;
      }
      const double u = static_cast<double>(s.neg_step_size) * m.data_ptr<float>()[k] /
                       (std::sqrt(static_cast<double>(vk)) / s.bias_correction2_sqrt + s.eps);
      const float larger = std::max(std::fabs(a), std::fabs(b));
      const double ulp = std::nextafter(larger, std::numeric_limits<float>::infinity()) - larger;
      failures += std::fabs(static_cast<double>(a) - b) > std::ldexp(std::fabs(u), -20) + ulp;
    }
    EXPECT_EQ(failures, 0) << "param " << i;
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
