// scale_fused: which tensors it takes, the bits of mul_ on each, the version counter bumped, and
// the refusal of a tensor it does not take.
#include "mixtrain/optim/scale_fused.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(ScaleFusedTest, TakesContiguousFloat32CpuTensorsOnly) {
  EXPECT_TRUE(scale_fusable(at::ones({4, 3})));
  EXPECT_FALSE(scale_fusable(at::Tensor()));
  EXPECT_FALSE(scale_fusable(at::ones({4, 3}, at::kBFloat16)));
  EXPECT_FALSE(scale_fusable(at::ones({4, 3}, at::kDouble)));
  EXPECT_FALSE(scale_fusable(at::ones({4, 3}).t()));  // not contiguous
}

TEST(ScaleFusedTest, ScalesEveryTensorAsMulAndBumpsVersions) {
  at::manual_seed(3);
  std::vector<at::Tensor> tensors = {at::randn({5, 7}), at::randn({1000}), at::randn({0})};
  std::vector<at::Tensor> expected;
  std::vector<uint32_t> versions;
  for (const auto& t : tensors) {
    expected.push_back(t.clone().mul_(0.3));
    versions.push_back(t._version());
  }
  scale_fused(tensors, 0.3);
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(std::memcmp(tensors[i].data_ptr(), expected[i].data_ptr(), tensors[i].nbytes()), 0)
        << i;
    EXPECT_EQ(tensors[i]._version(), versions[i] + 1) << i;
  }
  EXPECT_THROW(scale_fused({at::ones({2}, at::kBFloat16)}, 0.5), c10::Error);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
