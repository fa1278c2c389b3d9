// model/routed_experts.h on the CPU: the grouped form (LibTorch's grouped GEMM, group ends on
// the device) against the loop form and both against a float64 reference computed token by
// token from the formula (support/routed_experts_reference.h), output and every gradient (hidden,
// routing weights, the three stacked weights); an expert with no token; the host reads each form
// makes. Tolerances, relative to the largest magnitude of the quantity: both forms compute each
// GEMM in float32 and round its output to bfloat16 (u = 2^-8), then a SwiGLU product, the down GEMM
// and the weighting each round once more, and the sum over the top-k slots once per slot (loop)
// or once (grouped): at most ~6 roundings along any path, and the backward as many again; 12 u
// bounds every quantity; both forms are measured far below it. A wrong expert, slot weight or
// order is off by O(1).
#include "mixtrain/model/routed_experts.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mixtrain/core/host_sync.h"
#include "support/routed_experts_reference.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using test_support::ExpertInputs;
using test_support::ExpertResult;
using test_support::make_expert_inputs;
using test_support::reference_form;
using test_support::relative;
using test_support::run_experts;

TEST(RoutedExperts, BothFormsMatchTheFloat64ReferenceAndEachOther) {
  const ExpertInputs in = make_expert_inputs();
  const ExpertResult ref = run_experts(reference_form, in, at::kDouble);
  const ExpertResult loop = run_experts(routed_experts_loop, in, at::kBFloat16);
  const ExpertResult grouped = run_experts(routed_experts_grouped, in, at::kBFloat16);
  const double u = std::ldexp(1.0, -8);
  const char* names[] = {"out", "d hidden", "d weights", "d gate", "d up", "d down"};
  for (size_t i = 0; i < ref.values.size(); ++i) {
    ASSERT_GT(ref.values[i].abs().max().item<double>(), 0.01) << names[i];  // not vacuous
    EXPECT_EQ(grouped.values[i].scalar_type(), at::kBFloat16) << names[i];
    const double e_loop = relative(loop.values[i], ref.values[i]);
    const double e_grouped = relative(grouped.values[i], ref.values[i]);
    std::printf("%-10s loop %.2f u, grouped %.2f u\n", names[i], e_loop / u, e_grouped / u);
    EXPECT_LE(e_loop, 12 * u) << names[i];
    EXPECT_LE(e_grouped, 12 * u) << names[i];
  }
  // The empty expert gets a zero gradient from both forms.
  EXPECT_EQ(grouped.values[3][2].abs().max().item<double>(), 0.0);
  EXPECT_EQ(loop.values[3][2].abs().max().item<double>(), 0.0);
}

TEST(RoutedExperts, OnlyTheLoopReadsOnTheHost) {
  const ExpertInputs in = make_expert_inputs();
  reset_host_reads();
  routed_experts_grouped(in.hidden, in.selected, in.weights, in.gate, in.up, in.down);
  EXPECT_EQ(host_reads().total, 0);
  routed_experts_loop(in.hidden, in.selected, in.weights, in.gate, in.up, in.down);
  EXPECT_EQ(host_reads().by_site, (std::map<std::string, int64_t>{{"moe: tokens per expert", 1}}));
}

TEST(RoutedExperts, TheGroupedFormIsForBf16OnCudaWithAlignedDims) {
  const ExpertInputs in = make_expert_inputs();
  EXPECT_FALSE(grouped_experts_supported(in.hidden, in.gate, in.up, in.down));  // the CPU
}

// The forms agree in float32 too (no bfloat16 rounding between the GEMMs), within float32's
// reordering of the same sums: 1e-5 relative.
TEST(RoutedExperts, FormsAgreeInFloat32) {
  const ExpertInputs in = make_expert_inputs();
  const ExpertResult loop = run_experts(routed_experts_loop, in, at::kFloat);
  const ExpertResult grouped = run_experts(routed_experts_grouped, in, at::kFloat);
  for (size_t i = 0; i < loop.values.size(); ++i) {
    EXPECT_LE(relative(grouped.values[i], loop.values[i].to(at::kDouble)), 1e-5) << i;
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
