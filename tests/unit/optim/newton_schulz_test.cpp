// Newton–Schulz tests. Expectations come from the theory of the iteration, computed here
// independently in double precision, never from newton_schulz's own output:
//
// With X_0 = G / ||G||_F = U S V^T, every step maps X = U S V^T to U p(S) V^T with
// p(s) = a s + b s^3 + c s^5, so in exact arithmetic the output singular values are exactly
// the scalar map p_N(...p_1(s)) of the normalized input singular values s (svdvals in float64).
// The band of a schedule is the image of the input range under that scalar map. For inputs
// with normalized singular values in [0.01, 1] (ScalarBands below):
//   legacy x5          [0.6818, 1.1344]   (p(1) = 0.701, p'(0) = 3.44: small values grow
//                                          ~3.4x per step, then oscillate in the band where
//                                          p'(0.68) ~ -1; max of p on [0, 1] is 1.2025)
//   asym5              [0.9778, 1.0318]   (last triple: p(1) = 0.985, p'(1) = -0.31)
//   hybrid x10         [1.0000, 1.0006]   (8 legacy steps give [0.68, 1.13]; (2, -1.5, 0.5) has
//                                          p(1) = 1, p'(1) = 0, so two steps square the error)
//   custom (4 legacy + 2 x (15, -10, 3)/8, the quintic with p(1) = 1, p'(1) = p''(1) = 0)
//                      [0.9995, 1.0000]
// Rounding widens the band:
//   float32: by 1e-4 (measured deviation from the scalar map <= 1.3e-6 on these inputs;
//            float32 GEMMs round at ~6e-8 per product, 5-10 steps of 3 products each);
//   bfloat16 (8 significant bits, unit roundoff 2^-9 ~ 0.002 per GEMM output): the error of
//            every step survives where |p'| ~ 1 (legacy's band edges: p'(0.68) ~ -1) and is
//            amplified like the small singular values themselves (x a per step), so the
//            margins are set from the deviations measured beyond the exact band over 120 random
//            inputs (30 seeds x these 4 shapes), with ~1.5x headroom: legacy 0.1 (measured
//            0.070), asym5 0.06 (0.042), custom 0.05 (0.031), hybrid 0.02 (0.007; its last
//            steps have p'(1) = 0 and damp earlier errors). Keller Jordan's reference documents
//            legacy bf16 output singular values in ~(0.5, 1.5); our widened legacy band
//            [0.58, 1.23] lies inside it.
#include "mixtrain/optim/newton_schulz.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain {
namespace {

constexpr NsCoefficients kLegacy = {3.4445, -4.7750, 2.0315};
constexpr NsCoefficients kQuinticPolish = {15.0 / 8, -10.0 / 8, 3.0 / 8};
constexpr double kEps = 1e-7;

std::vector<NsCoefficients> custom_schedule() {
  return {kLegacy, kLegacy, kLegacy, kLegacy, kQuinticPolish, kQuinticPolish};
}

struct Schedule {
  std::string name;
  std::vector<NsCoefficients> coefficients;
  double bf16_margin;  // band widening for bfloat16, see the file comment
};

std::vector<Schedule> schedules() {
  return {{"legacy", newton_schulz_schedule("legacy", 5), 0.1},
          {"asym5", newton_schulz_schedule("asym5", 5), 0.06},
          {"hybrid10", newton_schulz_schedule("hybrid", 10), 0.02},
          {"custom", newton_schulz_schedule("custom", 6, custom_schedule()), 0.05}};
}

constexpr double kFloat32Margin = 1e-4;

double scalar_map(double s, const std::vector<NsCoefficients>& schedule) {
  for (const auto& [a, b, c] : schedule) s = a * s + b * s * s * s + c * s * s * s * s * s;
  return s;
}

// Image of [lo, hi] under the scalar map, on a grid fine enough for these smooth polynomials.
std::pair<double, double> band(const std::vector<NsCoefficients>& schedule, double lo, double hi) {
  constexpr int kPoints = 20000;
  double min_out = 1e300, max_out = -1e300;
  for (int i = 0; i <= kPoints; ++i) {
    const double out = scalar_map(lo + (hi - lo) * i / kPoints, schedule);
    min_out = std::min(min_out, out);
    max_out = std::max(max_out, out);
  }
  return {min_out, max_out};
}

at::Tensor random_normal(at::IntArrayRef shape, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen, at::kFloat);
}

// Singular values of each matrix of g divided by its Frobenius norm, in float64.
at::Tensor normalized_singular_values(const at::Tensor& g) {
  const at::Tensor x = g.to(at::kDouble);
  return at::linalg_svdvals(x / at::linalg_vector_norm(x, 2, at::IntArrayRef({-2, -1}), true));
}

TEST(NewtonSchulzScheduleTest, LegacyRepeatsTheOneTriple) {
  const auto s = newton_schulz_schedule("legacy", 7);
  ASSERT_EQ(s.size(), 7u);
  for (const auto& c : s) EXPECT_EQ(c, kLegacy);
}

TEST(NewtonSchulzScheduleTest, Asym5UsesTheFirstNTriplesAndRejectsMoreThanFive) {
  const std::vector<NsCoefficients> design = {{4.0848, -6.8946, 2.9270},
                                              {3.9505, -6.3029, 2.6377},
                                              {3.7418, -5.5913, 2.3037},
                                              {2.8769, -3.1427, 1.2046},
                                              {2.8366, -3.0525, 1.2012}};
  EXPECT_EQ(newton_schulz_schedule("asym5", 5), design);
  EXPECT_EQ(newton_schulz_schedule("asym5", 3),
            std::vector<NsCoefficients>(design.begin(), design.begin() + 3));
  try {
    newton_schulz_schedule("asym5", 6);
    FAIL() << "asym5 with 6 steps must throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "asym5 has 5 coefficient sets; muon_ns_steps=6");
  }
}

TEST(NewtonSchulzScheduleTest, HybridIsEightLegacyStepsThenThePolishTriple) {
  const auto s = newton_schulz_schedule("hybrid", 10);
  ASSERT_EQ(s.size(), 10u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(s[i], kLegacy) << "step " << i;
  for (int i = 8; i < 10; ++i) EXPECT_EQ(s[i], (NsCoefficients{2.0, -1.5, 0.5})) << "step " << i;
  // Fewer than 8 steps never reach the polish triple.
  EXPECT_EQ(newton_schulz_schedule("hybrid", 5), newton_schulz_schedule("legacy", 5));
}

TEST(NewtonSchulzScheduleTest, CustomMustMatchNsSteps) {
  EXPECT_EQ(newton_schulz_schedule("custom", 6, custom_schedule()), custom_schedule());
  EXPECT_THROW(newton_schulz_schedule("custom", 5, custom_schedule()), std::invalid_argument);
  EXPECT_THROW(newton_schulz_schedule("custom", 1), std::invalid_argument);
}

TEST(NewtonSchulzScheduleTest, RejectsUnknownVariantAndNonPositiveSteps) {
  EXPECT_THROW(newton_schulz_schedule("cubic", 5), std::invalid_argument);
  EXPECT_THROW(newton_schulz_schedule("legacy", 0), std::invalid_argument);
  EXPECT_THROW(newton_schulz_schedule("asym5", -1), std::invalid_argument);
}

// The headline bands of the file comment, from the scalar map alone (3 decimals is all the
// comment claims).
TEST(NewtonSchulzBandTest, ScalarBands) {
  const auto legacy = band(newton_schulz_schedule("legacy", 5), 0.01, 1.0);
  EXPECT_NEAR(legacy.first, 0.6818, 1e-3);
  EXPECT_NEAR(legacy.second, 1.1344, 1e-3);
  const auto asym5 = band(newton_schulz_schedule("asym5", 5), 0.01, 1.0);
  EXPECT_NEAR(asym5.first, 0.9778, 1e-3);
  EXPECT_NEAR(asym5.second, 1.0318, 1e-3);
  const auto hybrid = band(newton_schulz_schedule("hybrid", 10), 0.01, 1.0);
  EXPECT_NEAR(hybrid.first, 1.0, 1e-3);
  EXPECT_NEAR(hybrid.second, 1.0005, 1e-3);
  const auto custom = band(custom_schedule(), 0.01, 1.0);
  EXPECT_NEAR(custom.first, 0.9995, 1e-3);
  EXPECT_NEAR(custom.second, 1.0, 1e-3);
}

struct Input {
  std::string name;
  std::vector<int64_t> shape;
};

const std::vector<Input>& inputs() {
  static const std::vector<Input> kInputs = {
      {"tall", {48, 16}}, {"wide", {16, 48}}, {"square", {32, 32}}, {"experts", {4, 24, 16}}};
  return kInputs;
}

TEST(NewtonSchulzBandTest, SingularValuesLieInTheScheduleBand) {
  uint64_t seed = 100;
  for (const auto& input : inputs()) {
    const at::Tensor g = random_normal(input.shape, ++seed);
    const at::Tensor s_in = normalized_singular_values(g);
    const double lo = s_in.min().item<double>();
    const double hi = s_in.max().item<double>();
    for (const auto& schedule : schedules()) {
      const auto [band_lo, band_hi] = band(schedule.coefficients, lo, hi);
      for (const auto dtype : {at::kBFloat16, at::kFloat}) {
        const double margin = dtype == at::kFloat ? kFloat32Margin : schedule.bf16_margin;
        const at::Tensor out = newton_schulz(g, schedule.coefficients, kEps, dtype);
        ASSERT_EQ(out.scalar_type(), dtype);
        ASSERT_EQ(out.sizes(), g.sizes());
        const at::Tensor s_out = at::linalg_svdvals(out.to(at::kDouble));
        const std::string what = input.name + " " + schedule.name + " " +
                                 std::string(c10::toString(dtype)) + " input s in [" +
                                 std::to_string(lo) + ", " + std::to_string(hi) + "]";
        EXPECT_GE(s_out.min().item<double>(), band_lo - margin) << what;
        EXPECT_LE(s_out.max().item<double>(), band_hi + margin) << what;
      }
    }
  }
}

// In float32 each output singular value is the scalar map of an input one (as multisets:
// the map is not monotonic, so compare sorted lists per matrix).
TEST(NewtonSchulzBandTest, Float32SingularValuesFollowTheScalarMap) {
  uint64_t seed = 200;
  for (const auto& input : inputs()) {
    const at::Tensor g = random_normal(input.shape, ++seed);
    const at::Tensor s_in =
        normalized_singular_values(g).reshape({-1, std::min(g.size(-2), g.size(-1))});
    for (const auto& schedule : schedules()) {
      at::Tensor expected = s_in.clone();
      auto e = expected.accessor<double, 2>();
      for (int64_t m = 0; m < e.size(0); ++m) {
        for (int64_t i = 0; i < e.size(1); ++i)
          e[m][i] = scalar_map(e[m][i], schedule.coefficients);
      }
      const at::Tensor out = newton_schulz(g, schedule.coefficients, kEps, at::kFloat);
      const at::Tensor s_out =
          at::linalg_svdvals(out.to(at::kDouble)).reshape({-1, expected.size(1)});
      const double diff =
          (std::get<0>(s_out.sort(-1)) - std::get<0>(expected.sort(-1))).abs().max().item<double>();
      EXPECT_LT(diff, kFloat32Margin) << input.name << " " << schedule.name;
    }
  }
}

// hybrid10 ends within 6e-4 of all-ones singular values, so the output is the polar factor
// U V^T of the input: entries within 1e-3 in float32; bfloat16 adds its 0.02 band widening and
// singular-vector rounding, so 0.03 (measured over 30 seeds: 2.4e-4 and 0.0071).
TEST(NewtonSchulzTest, HybridApproximatesThePolarFactor) {
  const at::Tensor g = random_normal({24, 40}, 300);
  const auto svd = at::linalg_svd(g.to(at::kDouble), /*full_matrices=*/false);
  const at::Tensor polar = at::matmul(std::get<0>(svd), std::get<2>(svd));
  const auto schedule = newton_schulz_schedule("hybrid", 10);
  const auto err = [&](c10::ScalarType dtype) {
    return (newton_schulz(g, schedule, kEps, dtype).to(at::kDouble) - polar)
        .abs()
        .max()
        .item<double>();
  };
  EXPECT_LT(err(at::kFloat), 1e-3);
  EXPECT_LT(err(at::kBFloat16), 0.03);
}

// A tall G is orthogonalized as G^T: same data, same GEMMs, so bitwise equal.
TEST(NewtonSchulzTest, TallInputIsTheTransposedWideOne) {
  const at::Tensor tall = random_normal({40, 12}, 400);
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    const at::Tensor direct = newton_schulz(tall, newton_schulz_schedule("asym5", 5), kEps, dtype);
    const at::Tensor via_wide =
        newton_schulz(tall.t().contiguous(), newton_schulz_schedule("asym5", 5), kEps, dtype).t();
    ASSERT_EQ(direct.sizes(), tall.sizes());
    EXPECT_TRUE(at::equal(direct, via_wide)) << c10::toString(dtype);
  }
}

// ||0||_F = 0: eps keeps 0 / (0 + eps) = 0; without it 0/0 is NaN.
TEST(NewtonSchulzTest, EpsGuardsAZeroMatrix) {
  const at::Tensor zero = at::zeros({2, 8, 5});
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    const at::Tensor out = newton_schulz(zero, newton_schulz_schedule("legacy", 5), kEps, dtype);
    EXPECT_TRUE(at::isfinite(out).all().item<bool>()) << c10::toString(dtype);
    EXPECT_EQ(at::count_nonzero(out).item<int64_t>(), 0) << c10::toString(dtype);
  }
  const at::Tensor unguarded =
      newton_schulz(zero, newton_schulz_schedule("legacy", 5), 0.0, at::kFloat);
  EXPECT_TRUE(at::isnan(unguarded).all().item<bool>());
}

// A zero expert next to a non-zero one stays zero: normalization is per matrix.
TEST(NewtonSchulzTest, LeadingDimsAreIndependentMatrices) {
  at::Tensor g = random_normal({3, 6, 10}, 500);
  g[1].zero_();
  const auto schedule = newton_schulz_schedule("legacy", 5);
  const at::Tensor batched = newton_schulz(g, schedule, kEps, at::kFloat);
  EXPECT_EQ(at::count_nonzero(batched[1]).item<int64_t>(), 0);
  // float32 GEMMs on the same matrices: batched and single calls agree to float32 rounding
  // (a few ulps of the O(1) entries, amplified at most ~4x per step for 5 steps: 1e-5).
  for (int64_t e : {0, 2}) {
    const at::Tensor single = newton_schulz(g[e], schedule, kEps, at::kFloat);
    EXPECT_LT((batched[e] - single).abs().max().item<double>(), 1e-5) << "expert " << e;
  }
}

// A stack larger than one call is orthogonalized in calls of newton_schulz_matrices_per_call()
// matrices: the same per-call computation, assembled in order, so each part is BITWISE what a
// call on that part alone gives (tall matrices, so the transposed path is covered too).
TEST(NewtonSchulzTest, LargeStacksAreSplitIntoCallsWithoutChangingTheResult) {
  const int64_t rows = 40, cols = 24;
  const int64_t per_call = newton_schulz_matrices_per_call(rows, cols, at::kBFloat16);
  EXPECT_EQ(per_call, kNewtonSchulzBytesPerCall / (rows * cols * 2));
  const at::Tensor g = random_normal({2 * per_call + 3, rows, cols}, 700);
  const auto schedule = newton_schulz_schedule("asym5", 5);
  const at::Tensor all = newton_schulz(g, schedule, kEps, at::kBFloat16);
  ASSERT_EQ(all.sizes(), g.sizes());
  for (int64_t first = 0; first < g.size(0); first += per_call) {
    const int64_t count = std::min(per_call, g.size(0) - first);
    const at::Tensor part = newton_schulz(g.narrow(0, first, count), schedule, kEps, at::kBFloat16);
    EXPECT_TRUE(at::equal(all.narrow(0, first, count), part)) << "matrices from " << first;
  }
  // One matrix larger than the budget still goes alone.
  EXPECT_EQ(newton_schulz_matrices_per_call(4096, 4096, at::kFloat), 1);
}

TEST(NewtonSchulzTest, LeavesTheInputAloneAndKeepsItsShape) {
  const at::Tensor g = random_normal({2, 3, 7, 5}, 600);
  const at::Tensor before = g.clone();
  const at::Tensor out = newton_schulz(g, newton_schulz_schedule("asym5", 5), kEps, at::kBFloat16);
  EXPECT_TRUE(at::equal(g, before));
  EXPECT_EQ(out.sizes(), g.sizes());
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(out.is_contiguous());
}

TEST(NewtonSchulzTest, RejectsVectorsAndUnsupportedDtypes) {
  const auto schedule = newton_schulz_schedule("legacy", 5);
  EXPECT_THROW(newton_schulz(at::ones({4}), schedule, kEps, at::kFloat), std::invalid_argument);
  EXPECT_THROW(newton_schulz(at::ones({4, 4}), schedule, kEps, at::kInt), std::invalid_argument);
  EXPECT_THROW(newton_schulz(at::ones({4, 4}), schedule, kEps, at::kHalf), std::invalid_argument);
}

}  // namespace
}  // namespace mixtrain
