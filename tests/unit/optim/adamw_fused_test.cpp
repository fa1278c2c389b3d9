// optim/adamw_fused.h on the CPU: which tensors the pass takes, and that a list of updates gives
// each parameter what the capability's kernel gives it alone (the kernel's bits against
// torch.optim.AdamW are adamw_test's; the CUDA twin's, adamw_kernel_cuda_test's).
#include "mixtrain/optim/adamw_fused.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "mixtrain/core/cpu_capability.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

AdamWStepScalars scalars(float lr) {
  return {1 - lr * 0.01f, 0.1f, 0.999f, 0.001f, 0.05f, 1e-8f, -lr / 0.1f};
}

TEST(AdamWFused, TakesContiguousFloat32OnOneDevice) {
  const at::Tensor p = at::zeros({4}), g = at::zeros({4}), m = at::zeros({4}), v = at::zeros({4});
  EXPECT_TRUE(adamw_fusable(p, g, m, v));
  EXPECT_FALSE(adamw_fusable(p, g.to(at::kBFloat16), m, v));
  EXPECT_FALSE(adamw_fusable(p, at::zeros({5}), m, v));
  EXPECT_FALSE(adamw_fusable(p, g, at::zeros({4, 2}).select(1, 0), v));
  EXPECT_FALSE(adamw_fusable(at::Tensor(), g, m, v));
  EXPECT_TRUE(adamw_fusable_model(at::zeros({4}, at::kBFloat16), p));
  EXPECT_FALSE(adamw_fusable_model(at::zeros({4}), p));
  EXPECT_FALSE(adamw_fusable_model(at::zeros({3}, at::kHalf), p));
  EXPECT_THROW(adamw_step_fused({{p, g.to(at::kHalf), m, v, at::Tensor(), scalars(0.1f)}}),
               c10::Error);
}

TEST(AdamWFused, EachUpdateAsTheKernelGivesItAlone) {
  at::manual_seed(9);
  using Kernel = void (*)(const AdamWStepScalars&, float*, const float*, float*, float*, void*,
                          c10::ScalarType, int64_t);
  const Kernel kernel =
      select_kernel<Kernel>(DEFAULT::adamw_step, AVX2::adamw_step, AVX512::adamw_step);
  std::vector<AdamWFusedUpdate> updates;
  std::vector<std::vector<at::Tensor>> expected;  // param, exp_avg, exp_avg_sq, model
  for (int i = 0; i < 3; ++i) {
    const int64_t n = 100 * i + 17;
    AdamWFusedUpdate u{at::randn({n}),
                       at::randn({n}),
                       at::randn({n}) * 0.1,
                       at::rand({n}) * 0.01,
                       i == 1 ? at::Tensor() : at::empty({n}, at::kBFloat16),
                       scalars(0.01f * (i + 1))};
    std::vector<at::Tensor> e = {u.param.clone(), u.exp_avg.clone(), u.exp_avg_sq.clone(),
                                 u.model_param.defined() ? u.model_param.clone() : at::Tensor()};
    kernel(u.scalars, e[0].data_ptr<float>(), u.grad.data_ptr<float>(), e[1].data_ptr<float>(),
           e[2].data_ptr<float>(), e[3].defined() ? e[3].data_ptr() : nullptr, at::kBFloat16, n);
    updates.push_back(u);
    expected.push_back(e);
  }
  const auto version = updates[0].exp_avg._version();
  adamw_step_fused(updates);
  for (size_t i = 0; i < updates.size(); ++i) {
    EXPECT_TRUE(same_bits(updates[i].param, expected[i][0])) << i;
    EXPECT_TRUE(same_bits(updates[i].exp_avg, expected[i][1])) << i;
    EXPECT_TRUE(same_bits(updates[i].exp_avg_sq, expected[i][2])) << i;
    if (expected[i][3].defined()) {
      EXPECT_TRUE(same_bits(updates[i].model_param, expected[i][3])) << i;
      EXPECT_TRUE(same_bits(updates[i].model_param, updates[i].param.to(at::kBFloat16))) << i;
    }
  }
  EXPECT_GT(updates[0].exp_avg._version(), version);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
