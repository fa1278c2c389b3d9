// DynamicLossScaler::unscale_and_flag on CUDA grads (label cuda; skipped without a device): the
// multi-tensor pass (ATen's _amp_foreach_non_finite_check_and_unscale_) against the per-tensor
// form on CPU copies: the same unscaled bits (both multiply by float(1 / scale) in float), the
// flag 1 exactly when an element is inf or nan, kept on the device, no host read counted.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "mixtrain/core/host_sync.h"
#include "mixtrain/optim/loss_scaler.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

const at::Device kGpu("cuda:0");

TEST(LossScalerCuda, MultiTensorUnscaleIsThePerTensorOneAndFlagsOnTheDevice) {
  DynamicLossScalerOptions options;
  options.initial_scale = 3.0 * 1024;  // 1 / scale is not a power of two: rounding matters
  const DynamicLossScaler scaler(options);
  for (const bool overflow : {false, true}) {
    at::manual_seed(17);
    std::vector<at::Tensor> cpu = {at::randn({33, 7}) * 4000, at::randn({5}) * 4000, {}};
    if (overflow) cpu[1][3] = std::numeric_limits<float>::infinity();
    std::vector<at::Tensor> gpu;
    for (const auto& t : cpu) gpu.push_back(t.defined() ? t.to(kGpu) : at::Tensor());
    reset_host_reads();
    const at::Tensor flag = scaler.unscale_and_flag(gpu);
    EXPECT_EQ(host_reads().total, 0);
    EXPECT_EQ(flag.device(), kGpu);
    EXPECT_EQ(flag.item<int64_t>(), overflow ? 1 : 0);
    EXPECT_EQ(scaler.unscale_and_check(cpu), overflow);  // the per-tensor form
    for (size_t i = 0; i < cpu.size(); ++i) {
      if (!cpu[i].defined()) continue;
      EXPECT_TRUE(at::equal(gpu[i].cpu(), cpu[i])) << "grad " << i;  // inf stays inf
    }
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
