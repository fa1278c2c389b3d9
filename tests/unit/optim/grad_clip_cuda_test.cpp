// clip_grad_norm_unread on CUDA grads (optim/grad_clip.h): the device form (sums, norm and
// coefficient on the device, one multi-tensor multiply) against the host form on copies of the
// same grads: the same arithmetic in the same order, so the norm and every clipped grad are
// bitwise equal; a non-finite norm leaves the grads alone; max_norm <= 0 only measures; no
// host read is counted (core/host_sync.h).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "mixtrain/core/collectives.h"
#include "mixtrain/core/host_sync.h"
#include "mixtrain/core/param_placement.h"
#include "mixtrain/optim/grad_clip.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

const at::Device kGpu("cuda:0");

struct Case {
  std::vector<at::Tensor> grads;  // float32, bfloat16, undefined, on the GPU
  std::vector<ParamPlacement> placements;
  std::shared_ptr<Collectives> shard_group = make_local_collectives("dp_shard");
};

Case make_case(double scale) {
  at::manual_seed(5);
  Case c;
  c.grads = {(at::randn({7, 5}) * scale).to(kGpu),
             (at::randn({33}) * scale).to(kGpu, at::kBFloat16), at::Tensor(),
             (at::randn({6, 4}) * scale).to(kGpu)};
  c.placements = {whole_placement("a", {7, 5}), whole_placement("b", {33}),
                  whole_placement("c", {3}), whole_placement("d", {6, 4})};
  c.placements[3].kind = ParamPlacement::Kind::kDim0Shard;  // a second (pieces) group
  c.placements[3].shard_group = c.shard_group;
  return c;
}

std::vector<at::Tensor> copies(const std::vector<at::Tensor>& grads) {
  std::vector<at::Tensor> out;
  for (const auto& g : grads) out.push_back(g.defined() ? g.clone() : at::Tensor());
  return out;
}

std::vector<const ParamPlacement*> pointers(const std::vector<ParamPlacement>& placements) {
  std::vector<const ParamPlacement*> out;
  for (const auto& p : placements) out.push_back(&p);
  return out;
}

void expect_same_bits(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].defined(), b[i].defined()) << i;
    if (a[i].defined()) {
      EXPECT_TRUE(a[i].cpu().equal(b[i].cpu())) << "grad " << i;
    }
  }
}

TEST(GradClipCuda, DeviceFormIsTheHostFormBitForBit) {
  for (const double max_fraction : {0.25, 4.0, 0.0}) {  // clips; below max; measures only
    SCOPED_TRACE(max_fraction);
    Case c = make_case(1.0);
    std::vector<at::Tensor> host_grads = copies(c.grads);
    const auto placements = pointers(c.placements);
    const double reference = clip_grad_norm(copies(c.grads), placements, -1.0);  // measures
    const double max_norm = max_fraction * reference;
    const double host = clip_grad_norm(host_grads, placements, max_norm);
    reset_host_reads();
    const at::Tensor device = clip_grad_norm_unread(c.grads, placements, max_norm);
    EXPECT_EQ(host_reads().total, 0);
    EXPECT_EQ(device.device(), kGpu);
    EXPECT_EQ(device.scalar_type(), at::kDouble);
    EXPECT_EQ(device.item<double>(), host);
    expect_same_bits(c.grads, host_grads);
  }
}

TEST(GradClipCuda, NonFiniteNormLeavesTheGradsAlone) {
  Case c = make_case(1.0);
  c.grads[0][2][3] = std::numeric_limits<float>::infinity();
  const std::vector<at::Tensor> before = copies(c.grads);
  const at::Tensor norm = clip_grad_norm_unread(c.grads, pointers(c.placements), 1e-3);
  EXPECT_TRUE(std::isinf(norm.item<double>()));
  expect_same_bits(c.grads, before);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
