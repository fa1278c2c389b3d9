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
// polar_express divides the norm by (1 + safety) first, so its map is s -> p_N(...p_1(s / k)),
// k = 1.02 (5 steps) or 1.01 (8 steps). Over the paper's design interval [l, 1] = [1e-3, 1]:
//   polar_express x5   [0.8466, 1.1411]
//   polar_express x8   [1 - 3e-15, 1 + 4e-16]: the paper's 8 steps converge to float64 accuracy
//                      (the last triples are the Pade-like (15, -10, 3)/8, and the safety is
//                      left off the last one so the fixed point is 1, not 1/1.01).
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
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

constexpr NsCoefficients kLegacy = {3.4445, -4.7750, 2.0315};
constexpr NsCoefficients kQuinticPolish = {15.0 / 8, -10.0 / 8, 3.0 / 8};
constexpr double kEps = 1e-7;

std::vector<NsCoefficients> custom_schedule() {
  return {kLegacy, kLegacy, kLegacy, kLegacy, kQuinticPolish, kQuinticPolish};
}

struct Schedule {
  std::string name;
  std::vector<NsCoefficients> coefficients;
  double bf16_margin;       // band widening for bfloat16, see the file comment
  double norm_scale = 1.0;  // newton_schulz_norm_scale()
};

std::vector<Schedule> schedules() {
  return {{"legacy", newton_schulz_schedule("legacy", 5), 0.1},
          {"asym5", newton_schulz_schedule("asym5", 5), 0.06},
          {"hybrid10", newton_schulz_schedule("hybrid", 10), 0.02},
          {"custom", newton_schulz_schedule("custom", 6, custom_schedule()), 0.05}};
}

// polar_express, with newton_schulz_norm_scale(). bfloat16 margins: the deviation beyond the
// exact band, measured (the same bmm / baddbmm sequence through torch 2.11 on this CPU) over the
// 102 of 120 random inputs (30 seeds x the 4 shapes below) whose smallest normalized singular
// value is >= 2^-8, with ~1.5x headroom: 5 steps 0.006 (measured 0.0040), 8 steps 0.008
// (0.0051). Not for inputs with a normalized singular value below
// bfloat16's resolution of the input: rounding X to 8 bits moves each singular value by up to
// ||E||_2 <= 2^-9 ||X||_F (Weyl), so such a value is not the one the iteration sees (a 32x32
// Gaussian matrix with one at 1.9e-4 came out at 0.43 after 8 steps, against a band of ~1).
std::vector<Schedule> polar_express_schedules() {
  return {{"polar_express5", newton_schulz_schedule("polar_express", 5), 0.006,
           newton_schulz_norm_scale("polar_express", 5)},
          {"polar_express8", newton_schulz_schedule("polar_express", 8), 0.008,
           newton_schulz_norm_scale("polar_express", 8)}};
}

constexpr double kFloat32Margin = 1e-4;

// s: a singular value of G / ||G||_F; the iteration starts from s / norm_scale.
double scalar_map(double s, const std::vector<NsCoefficients>& schedule, double norm_scale = 1.0) {
  s /= norm_scale;
  for (const auto& [a, b, c] : schedule) s = a * s + b * s * s * s + c * s * s * s * s * s;
  return s;
}

// Image of [lo, hi] under the scalar map, on a grid fine enough for these smooth polynomials.
std::pair<double, double> band(const std::vector<NsCoefficients>& schedule, double lo, double hi,
                               double norm_scale = 1.0) {
  constexpr int kPoints = 20000;
  double min_out = 1e300, max_out = -1e300;
  for (int i = 0; i <= kPoints; ++i) {
    const double out = scalar_map(lo + (hi - lo) * i / kPoints, schedule, norm_scale);
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

TEST(NewtonSchulzScheduleTest, QuinticIsAsym5UnderAnotherName) {
  for (int64_t steps = 1; steps <= 5; ++steps) {
    EXPECT_EQ(newton_schulz_schedule("quintic", steps), newton_schulz_schedule("asym5", steps));
    EXPECT_EQ(newton_schulz_norm_scale("quintic", steps), 1.0);
  }
  try {
    newton_schulz_schedule("quintic", 6);
    FAIL() << "quintic with 6 steps must throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "quintic has 5 coefficient sets; muon_ns_steps=6");
  }
}

// The paper's Algorithm 1 (arXiv 2505.16932), as printed: the eight triples before the safety
// factor. The code divides all but the last by (s, s^3, s^5), s = 1.01, i.e. p(x) -> p(x / s).
const std::vector<NsCoefficients> kPaperAlgorithm1 = {
    {8.28721201814563, -23.595886519098837, 17.300387312530933},
    {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
    {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
    {3.3184196573706015, -2.488488024314874, 0.51004894012372},
    {2.300652019954817, -1.6689039845747493, 0.4188073119525673},
    {1.891301407787398, -1.2679958271945868, 0.37680408948524835},
    {1.8750014808534479, -1.2500016453999487, 0.3750001645474248},
    {1.875, -1.25, 0.375}};

TEST(NewtonSchulzScheduleTest, PolarExpressEightStepsIsThePapersAlgorithm1WithItsSafety) {
  const auto s = newton_schulz_schedule("polar_express", 8);
  ASSERT_EQ(s.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    const double k = i + 1 < 8 ? 1.01 : 1.0;
    const auto& [a, b, c] = kPaperAlgorithm1[i];
    // s / k^n computed two ways (pow here, products there): a few ulps apart at most.
    EXPECT_NEAR(s[i][0], a / k, 1e-14 * std::abs(a)) << "step " << i;
    EXPECT_NEAR(s[i][1], b / std::pow(k, 3), 1e-14 * std::abs(b)) << "step " << i;
    EXPECT_NEAR(s[i][2], c / std::pow(k, 5), 1e-14 * std::abs(c)) << "step " << i;
  }
  EXPECT_EQ(newton_schulz_norm_scale("polar_express", 8), 1.01);
  // A second source: NVIDIA Emerging-Optimizers ships these after the safety, cut to 4 decimals
  // (8.20516... as 8.2051), so within 1e-4.
  const std::vector<NsCoefficients> emerging_optimizers = {
      {8.2051, -22.9019, 16.4607}, {4.0664, -2.8612, 0.5184}, {3.9096, -2.8234, 0.5250},
      {3.2856, -2.4153, 0.4853},   {2.2779, -1.6198, 0.3985}, {1.8726, -1.2307, 0.3585},
      {1.8564, -1.2132, 0.3568},   {1.8750, -1.2500, 0.3750}};
  for (size_t i = 0; i < 8; ++i) {
    for (int j = 0; j < 3; ++j) {
      EXPECT_NEAR(s[i][j], emerging_optimizers[i][j], 1e-4) << i << "," << j;
    }
  }
}

// The set designed for five steps (safety 1.02 already in all but the last triple), as
// modded-nanogpt and Dion ship it: not the first five of the eight.
TEST(NewtonSchulzScheduleTest, PolarExpressFiveStepsIsThePublishedFiveStepSet) {
  const std::vector<NsCoefficients> published = {
      {8.156554524902461, -22.48329292557795, 15.878769915207462},
      {4.042929935166739, -2.808917465908714, 0.5000178451051316},
      {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
      {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
      {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}};
  EXPECT_EQ(newton_schulz_schedule("polar_express", 5), published);
  EXPECT_EQ(newton_schulz_norm_scale("polar_express", 5), 1.02);
  const auto eight = newton_schulz_schedule("polar_express", 8);
  EXPECT_NE(published, std::vector<NsCoefficients>(eight.begin(), eight.begin() + 5));
}

TEST(NewtonSchulzScheduleTest, PolarExpressRefusesOtherStepCounts) {
  for (int64_t steps : {1, 4, 6, 7, 9, 10}) {
    const std::string expected =
        "polar_express has published 5-step and 8-step sets; "
        "muon_ns_steps=" +
        std::to_string(steps);
    try {
      newton_schulz_schedule("polar_express", steps);
      FAIL() << "polar_express with " << steps << " steps must throw";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(e.what(), expected);
    }
    EXPECT_THROW(newton_schulz_norm_scale("polar_express", steps), std::invalid_argument);
  }
  EXPECT_EQ(newton_schulz_norm_scale("legacy", 7), 1.0);
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

// polar_express over the paper's design interval [1e-3, 1], through the (1 + safety) scaling.
TEST(NewtonSchulzBandTest, PolarExpressScalarBands) {
  const auto five = band(newton_schulz_schedule("polar_express", 5), 1e-3, 1.0, 1.02);
  EXPECT_NEAR(five.first, 0.8466, 1e-3);
  EXPECT_NEAR(five.second, 1.1411, 1e-3);
  const auto eight = band(newton_schulz_schedule("polar_express", 8), 1e-3, 1.0, 1.01);
  EXPECT_NEAR(eight.first, 1.0, 1e-13);   // measured 1 - 3e-15
  EXPECT_NEAR(eight.second, 1.0, 1e-13);  // measured 1 + 4e-16
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
  std::vector<Schedule> all = schedules();
  for (auto& pe : polar_express_schedules()) all.push_back(pe);
  for (const auto& input : inputs()) {
    const at::Tensor g = random_normal(input.shape, ++seed);
    const at::Tensor s_in =
        normalized_singular_values(g).reshape({-1, std::min(g.size(-2), g.size(-1))});
    for (const auto& schedule : all) {
      at::Tensor expected = s_in.clone();
      auto e = expected.accessor<double, 2>();
      for (int64_t m = 0; m < e.size(0); ++m) {
        for (int64_t i = 0; i < e.size(1); ++i)
          e[m][i] = scalar_map(e[m][i], schedule.coefficients, schedule.norm_scale);
      }
      const at::Tensor out =
          newton_schulz(g, schedule.coefficients, kEps, at::kFloat, schedule.norm_scale);
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

// The iteration written out in float64, on the whole matrix (no transpose, no fused GEMMs):
// X_0 = G / (||G||_F (1 + safety) + eps); X <- a X + b (X X^T) X + c (X X^T)^2 X.
at::Tensor written_out_iteration(const at::Tensor& g, const std::vector<NsCoefficients>& triples,
                                 double safety) {
  at::Tensor x = g.to(at::kDouble);
  x = x / (at::linalg_vector_norm(x, 2, at::IntArrayRef({-2, -1}), true) * (1.0 + safety) + kEps);
  for (const auto& [a, b, c] : triples) {
    const at::Tensor gram = at::matmul(x, x.transpose(-2, -1));
    x = a * x + b * at::matmul(gram, x) + c * at::matmul(at::matmul(gram, gram), x);
  }
  return x;
}

// The triples from the test's own copy of the paper (divided here) and the safety written out:
// float64 agrees to 1e-10 (measured <= 9e-15 on entries of size ~0.2; roundoff 1.1e-16 per
// operation, amplified at most by p'(0) = a <= 8.3 per step). The scaling is checked on one
// step too: after all 8 steps the output is the polar factor whatever the scaling (measured
// 9e-15 apart), while one step from an unscaled input differs (measured 4e-3..1.1e-2; the scaled
// one <= 4.4e-16).
TEST(NewtonSchulzTest, PolarExpressIsTheWrittenOutIteration) {
  std::vector<NsCoefficients> eight = kPaperAlgorithm1;
  for (size_t i = 0; i + 1 < eight.size(); ++i) {
    eight[i] = {eight[i][0] / 1.01, eight[i][1] / std::pow(1.01, 3),
                eight[i][2] / std::pow(1.01, 5)};
  }
  const std::vector<std::pair<int64_t, double>> sets = {{5, 0.02}, {8, 0.01}};
  uint64_t seed = 800;
  for (const auto& [steps, safety] : sets) {
    const std::vector<NsCoefficients> triples =
        steps == 8 ? eight : newton_schulz_schedule("polar_express", 5);
    const auto schedule = newton_schulz_schedule("polar_express", steps);
    const double norm_scale = newton_schulz_norm_scale("polar_express", steps);
    for (const auto& input : inputs()) {
      const at::Tensor g = random_normal(input.shape, ++seed);
      const std::string what = input.name + " " + std::to_string(steps) + " steps";
      const at::Tensor full = newton_schulz(g, schedule, kEps, at::kDouble, norm_scale);
      const double d_full =
          (full - written_out_iteration(g, triples, safety)).abs().max().item<double>();
      EXPECT_LT(d_full, 1e-10) << what;
      const std::vector<NsCoefficients> first = {schedule[0]};
      const at::Tensor one_expected = written_out_iteration(g, {triples[0]}, safety);
      const double d_one = (newton_schulz(g, first, kEps, at::kDouble, norm_scale) - one_expected)
                               .abs()
                               .max()
                               .item<double>();
      EXPECT_LT(d_one, 1e-10) << what;
      const double d_unscaled =
          (newton_schulz(g, first, kEps, at::kDouble) - one_expected).abs().max().item<double>();
      EXPECT_GT(d_unscaled, 1e-3) << what;
    }
  }
}

// Orthogonal to the paper's accuracy: a matrix whose singular values span the paper's design
// range (log-spaced 1e-3..1; 8e-4..0.8 after the Frobenius normalization) comes out with every
// singular value within the scalar band of its inputs, float64 to 1e-10 and float32 to 1e-4
// (measured beyond the band: float64 <= 1.3e-14, float32 1.1e-6), and within max|1 - band| +
// that margin of the polar factor U V^T entrywise (U (p(S) - I) V^T: no entry exceeds the
// spectral norm). 5 steps: band [0.6129, 1.1411]. 8 steps: band [1 - 1.1e-7, 1], short of 1
// only because 8e-4 / 1.01 is below the design's l = 1e-3; measured entrywise distance to
// U V^T 2.0e-8 (float64), 2.2e-6 (float32).
TEST(NewtonSchulzBandTest, PolarExpressOrthogonalizesToThePapersBand) {
  const int64_t m = 24, n = 40;
  const auto qr_u = at::linalg_qr(random_normal({m, m}, 900).to(at::kDouble));
  const auto qr_v = at::linalg_qr(random_normal({n, m}, 901).to(at::kDouble));
  const at::Tensor sigma = at::logspace(-3, 0, m, 10.0, at::kDouble);
  const at::Tensor g =
      at::matmul(std::get<0>(qr_u) * sigma, std::get<0>(qr_v).transpose(0, 1));  // U S V^T
  const at::Tensor s_in = normalized_singular_values(g);
  const double lo = s_in.min().item<double>(), hi = s_in.max().item<double>();
  ASSERT_LT(lo, 1e-3);  // as hard as the paper's design interval allows
  const at::Tensor polar = at::matmul(std::get<0>(qr_u), std::get<0>(qr_v).transpose(0, 1));
  // The iteration starts from sigma / (||G||_F k + eps): eps (relative 8e-8 here) is part of
  // the scaling the float64 comparison sees.
  const double g_norm = at::linalg_vector_norm(g, 2).item<double>();
  for (const auto& schedule : polar_express_schedules()) {
    const double scale = schedule.norm_scale + kEps / g_norm;
    const auto [band_lo, band_hi] = band(schedule.coefficients, lo, hi, scale);
    for (const auto dtype : {at::kDouble, at::kFloat}) {
      const double margin = dtype == at::kDouble ? 1e-10 : kFloat32Margin;
      const at::Tensor out =
          newton_schulz(g, schedule.coefficients, kEps, dtype, schedule.norm_scale).to(at::kDouble);
      const at::Tensor s_out = at::linalg_svdvals(out);
      const std::string what = schedule.name + " " + std::string(c10::toString(dtype));
      EXPECT_GE(s_out.min().item<double>(), band_lo - margin) << what;
      EXPECT_LE(s_out.max().item<double>(), band_hi + margin) << what;
      const double off_one = std::max(1.0 - band_lo, band_hi - 1.0);
      EXPECT_LT((out - polar).abs().max().item<double>(), off_one + margin) << what;
    }
  }
}

// bfloat16 on rectangular Gaussian inputs (all normalized singular values above bfloat16's
// resolution of the input, checked): within the band plus the measured margin.
TEST(NewtonSchulzBandTest, PolarExpressBfloat16StaysInTheBand) {
  uint64_t seed = 1000;
  for (const auto& input : inputs()) {
    if (input.shape[input.shape.size() - 1] == input.shape[input.shape.size() - 2]) continue;
    const at::Tensor g = random_normal(input.shape, ++seed);
    const at::Tensor s_in = normalized_singular_values(g);
    const double lo = s_in.min().item<double>(), hi = s_in.max().item<double>();
    ASSERT_GE(lo, 1.0 / 256) << input.name;
    for (const auto& schedule : polar_express_schedules()) {
      const auto [band_lo, band_hi] = band(schedule.coefficients, lo, hi, schedule.norm_scale);
      const at::Tensor out =
          newton_schulz(g, schedule.coefficients, kEps, at::kBFloat16, schedule.norm_scale);
      const at::Tensor s_out = at::linalg_svdvals(out.to(at::kDouble));
      EXPECT_GE(s_out.min().item<double>(), band_lo - schedule.bf16_margin)
          << input.name << " " << schedule.name;
      EXPECT_LE(s_out.max().item<double>(), band_hi + schedule.bf16_margin)
          << input.name << " " << schedule.name;
    }
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
