// model/routed_experts.h on a CUDA device (label cuda; skipped without one): the grouped form,
// the model's on a device with LibTorch's grouped GEMM, against the float64 reference and the
// loop form on the same device, output and every gradient, with the bound of the CPU test
// (routed_experts_test.cpp: 12 u, u = 2^-8); no host read; the same bits from run to run (the
// backward adds no two rows into one).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "mixtrain/core/host_sync.h"
#include "mixtrain/model/routed_experts.h"
#include "support/routed_experts_reference.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using namespace test_support;  // NOLINT: the reference's names

const c10::Device kGpu(c10::kCUDA, 0);

TEST(RoutedExpertsCuda, GroupedFormMatchesTheReferenceTheLoopAndItself) {
  const ExpertInputs in = make_expert_inputs();
  EXPECT_TRUE(grouped_experts_supported(in.hidden.to(kGpu), in.gate.to(kGpu), in.up.to(kGpu),
                                        in.down.to(kGpu)));
  const ExpertResult ref = run_experts(reference_form, in, at::kDouble);
  reset_host_reads();
  const ExpertResult grouped = run_experts(routed_experts_grouped, in, at::kBFloat16, kGpu);
  EXPECT_EQ(host_reads().total, 0);
  const ExpertResult again = run_experts(routed_experts_grouped, in, at::kBFloat16, kGpu);
  const ExpertResult loop = run_experts(routed_experts_loop, in, at::kBFloat16, kGpu);
  const double u = std::ldexp(1.0, -8);
  const char* names[] = {"out", "d hidden", "d weights", "d gate", "d up", "d down"};
  for (size_t i = 0; i < ref.values.size(); ++i) {
    const double e_grouped = relative(grouped.values[i], ref.values[i]);
    const double e_loop = relative(loop.values[i], ref.values[i]);
    std::printf("%-10s grouped %.2f u, loop %.2f u\n", names[i], e_grouped / u, e_loop / u);
    EXPECT_LE(e_grouped, 12 * u) << names[i];
    EXPECT_LE(e_loop, 12 * u) << names[i];
    EXPECT_TRUE(grouped.values[i].equal(again.values[i])) << names[i] << ": run to run";
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
