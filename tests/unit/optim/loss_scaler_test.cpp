#include "mixtrain/optim/loss_scaler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>

#include "mixtrain/core/logging.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(DynamicLossScaler, DefaultsAreMegatrons) {
  DynamicLossScaler scaler;
  EXPECT_EQ(scaler.scale(), 65536.0);  // 2^16
  for (int i = 0; i < 999; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 65536.0);
  scaler.update(false);  // the 1000th clean step
  EXPECT_EQ(scaler.scale(), 131072.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(DynamicLossScaler, OverflowHalvesSkipsLogsAndRestartsTheCount) {
  DynamicLossScaler scaler(DynamicLossScalerOptions{8.0, 2.0, 0.5, 3, 1.0});
  scaler.update(false);
  scaler.update(false);
  const int warnings = warning_count();
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 4.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(warning_count(), warnings + 1);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 4.0);  // two clean steps since the overflow: not yet
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 8.0);
}

TEST(DynamicLossScaler, NeverDropsBelowMinScale) {
  DynamicLossScaler scaler(DynamicLossScalerOptions{2.0, 2.0, 0.5, 1000, 1.0});
  scaler.update(true);
  scaler.update(true);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 1.0);
  EXPECT_EQ(scaler.skipped_steps(), 3);
}

TEST(DynamicLossScaler, UnscalesExactlyAndDetectsInfAndNan) {
  DynamicLossScaler scaler(DynamicLossScalerOptions{1024.0, 2.0, 0.5, 1000, 1.0});
  at::Tensor a = at::tensor({1024.0f, -3072.0f, 1.0f});
  at::Tensor b = at::tensor({2048.0f});
  EXPECT_FALSE(scaler.unscale_and_check({a, at::Tensor(), b}));
  // Division by a power of two is exact in float32.
  EXPECT_TRUE(at::equal(a, at::tensor({1.0f, -3.0f, 1.0f / 1024})));
  EXPECT_TRUE(at::equal(b, at::tensor({2.0f})));
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(scaler.unscale_and_check({at::tensor({1.0f, inf})}));
  EXPECT_TRUE(scaler.unscale_and_check({at::tensor({std::nanf("")}), at::ones({2})}));
}

TEST(DynamicLossScaler, RejectsInvalidOptions) {
  EXPECT_THROW(DynamicLossScaler(DynamicLossScalerOptions{0.0, 2.0, 0.5, 1, 1.0}),
               std::invalid_argument);
  EXPECT_THROW(DynamicLossScaler(DynamicLossScalerOptions{8.0, 1.0, 0.5, 1, 1.0}),
               std::invalid_argument);
  EXPECT_THROW(DynamicLossScaler(DynamicLossScalerOptions{8.0, 2.0, 1.0, 1, 1.0}),
               std::invalid_argument);
  EXPECT_THROW(DynamicLossScaler(DynamicLossScalerOptions{8.0, 2.0, 0.5, 0, 1.0}),
               std::invalid_argument);
}

TEST(DynamicLossScaler, RestoreSetsTheCheckpointedState) {
  DynamicLossScaler scaler;
  scaler.restore(512.0, 7, 3);
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 7);
  EXPECT_EQ(scaler.skipped_steps(), 3);
  EXPECT_THROW(scaler.restore(0.0, 0, 0), std::invalid_argument);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
