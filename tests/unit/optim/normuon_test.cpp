// optim/normuon: NorMuon's row normalisation and cautious weight decay's mask against the
// formulas written out here in float64 (arXiv 2510.05491 Algorithm 1 with the authors' norm-
// preserving rescale; arXiv 2510.12402 Algorithm 1), never against our own output.
#include "mixtrain/optim/normuon.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

at::Tensor random_normal(at::IntArrayRef shape, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen, at::kFloat);
}

struct Expected {
  std::vector<double> v;    // new v, row-major over [..., m]
  std::vector<double> out;  // the update, row-major over [..., m, n]
};

// The formula element by element in float64, one matrix at a time.
Expected reference(const at::Tensor& o32, const at::Tensor& v32, double beta2, double eps) {
  const at::Tensor o = o32.to(at::kDouble).contiguous();
  const int64_t m = o.size(-2), n = o.size(-1), k = o.numel() / (m * n);
  const double* op = o.data_ptr<double>();
  const at::Tensor v0 = v32.to(at::kDouble).contiguous();
  Expected e{std::vector<double>(v0.data_ptr<double>(), v0.data_ptr<double>() + k * m),
             std::vector<double>(k * m * n)};
  for (int64_t b = 0; b < k; ++b) {
    double o_sq = 0.0, hat_sq = 0.0;
    std::vector<double> hat(m * n);
    for (int64_t i = 0; i < m; ++i) {
      double row_sq = 0.0;
      for (int64_t j = 0; j < n; ++j) row_sq += op[(b * m + i) * n + j] * op[(b * m + i) * n + j];
      double& v = e.v[b * m + i];
      v = beta2 * v + (1 - beta2) * row_sq / static_cast<double>(n);
      for (int64_t j = 0; j < n; ++j) {
        const double x = op[(b * m + i) * n + j];
        hat[i * n + j] = x / (std::sqrt(v) + eps);
        o_sq += x * x;
        hat_sq += hat[i * n + j] * hat[i * n + j];
      }
    }
    const double ratio = std::sqrt(o_sq) / (std::sqrt(hat_sq) + eps);
    for (int64_t i = 0; i < m * n; ++i) e.out[b * m * n + i] = hat[i] * ratio;
  }
  return e;
}

double max_rel_diff(const at::Tensor& got, const std::vector<double>& expected) {
  const at::Tensor g = got.to(at::kDouble).contiguous().view({-1});
  double scale = 0.0, diff = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    scale = std::max(scale, std::fabs(expected[i]));
    diff = std::max(diff, std::fabs(g[static_cast<int64_t>(i)].item<double>() - expected[i]));
  }
  return diff / scale;
}

// float32 against float64: each quantity passes through about ten roundings of 2^-24 and sums
// of at most m*n = 48 squares (at most 48 * 2^-24 relative if every addition rounded the same
// way): 1e-5 of the largest value is above that bound (~3.5e-6) and far below any formula
// error (a wrong beta2 weight, eps placement or norm moves values by > 1e-3 here).
constexpr double kFloat32Tolerance = 1e-5;

TEST(NorMuonTest, MatchesTheFormulaForBatchedTallAndWideMatrices) {
  for (const auto& shape : std::vector<std::vector<int64_t>>{{3, 6, 8}, {8, 6}, {2, 7, 4}}) {
    const at::Tensor o = random_normal(shape, 1) * 0.3;
    std::vector<int64_t> row_shape(shape.begin(), shape.end() - 1);
    at::Tensor v = random_normal(row_shape, 2).abs() * 0.05;  // a state from earlier steps
    for (const double beta2 : {0.95, 0.0, 0.5}) {
      at::Tensor state = v.clone();
      const Expected e = reference(o, state, beta2, 1e-10);
      const at::Tensor out = normuon_normalize(o, state, beta2, 1e-10);
      EXPECT_EQ(out.scalar_type(), at::kFloat);
      EXPECT_EQ(out.sizes(), o.sizes());
      EXPECT_LT(max_rel_diff(state, e.v), kFloat32Tolerance) << beta2;
      EXPECT_LT(max_rel_diff(out, e.out), kFloat32Tolerance) << beta2;
    }
  }
}

TEST(NorMuonTest, Bfloat16InputIsWidenedAndALargeEpsilonEntersBothPlaces) {
  const at::Tensor o = (random_normal({5, 9}, 3) * 0.2).to(at::kBFloat16);
  at::Tensor v = at::zeros({5});
  // eps 0.05 is comparable to sqrt(v) (~0.04 here), so its placement shows.
  const Expected e = reference(o, v, 0.9, 0.05);
  const at::Tensor out = normuon_normalize(o, v, 0.9, 0.05);
  EXPECT_LT(max_rel_diff(v, e.v), kFloat32Tolerance);
  EXPECT_LT(max_rel_diff(out, e.out), kFloat32Tolerance);
}

// beta2 0 from v = 0: v is the row's mean square, every row of O/sqrt(v) has RMS 1, and the
// rescale gives every row the norm ||O||_F / sqrt(m) and the matrix O's Frobenius norm.
TEST(NorMuonTest, EqualizesRowNormsAndKeepsTheFrobeniusNorm) {
  const at::Tensor o = random_normal({6, 10}, 4) * at::arange(1, 7).to(at::kFloat).view({6, 1});
  at::Tensor v = at::zeros({6});
  const at::Tensor out = normuon_normalize(o, v, 0.0, 1e-10);
  const double fro = o.to(at::kDouble).norm().item<double>();
  EXPECT_NEAR(out.to(at::kDouble).norm().item<double>(), fro, 1e-5 * fro);
  const at::Tensor row_norms = out.to(at::kDouble).norm(2, {1});
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(row_norms[i].item<double>(), fro / std::sqrt(6.0), 1e-5 * fro) << i;
  }
}

// The distributed owner normalizes one matrix alone; the local path a batch: the same bits.
TEST(NorMuonTest, AMatrixGivesTheSameBitsAloneOrBatched) {
  const at::Tensor o = random_normal({4, 33, 17}, 5);
  const at::Tensor v0 = random_normal({4, 33}, 6).abs();
  at::Tensor batched_v = v0.clone();
  const at::Tensor batched = normuon_normalize(o, batched_v, 0.95, 1e-10);
  for (int64_t b = 0; b < 4; ++b) {
    at::Tensor v = v0[b].clone();
    const at::Tensor alone = normuon_normalize(o[b], v, 0.95, 1e-10);
    EXPECT_TRUE(at::equal(alone, batched[b])) << b;
    EXPECT_TRUE(at::equal(v, batched_v[b])) << b;
  }
}

TEST(NorMuonTest, RejectsAStateOfTheWrongShapeOrDtype) {
  const at::Tensor o = at::ones({3, 4});
  at::Tensor wrong_shape = at::zeros({4});
  at::Tensor wrong_dtype = at::zeros({3}, at::kDouble);
  EXPECT_THROW(normuon_normalize(o, wrong_shape, 0.95, 1e-10), c10::Error);
  EXPECT_THROW(normuon_normalize(o, wrong_dtype, 0.95, 1e-10), c10::Error);
}

// I(u * x >= 0): same signs or a zero. 1e-30 * -1e-30 underflows to -0 in float32, which a
// product test would count as >= 0; the signs say the decay must not apply there.
TEST(CautiousDecayMaskTest, SignsAgreeOrAZero) {
  const at::Tensor update = at::tensor({0.5f, 0.5f, -1.0f, 0.0f, -2.0f, 1e-30f, 3.0f});
  const at::Tensor param = at::tensor({1.0f, -2.0f, 3.0f, -4.0f, -1.0f, -1e-30f, 0.0f});
  const at::Tensor mask = cautious_decay_mask(update, param);
  EXPECT_EQ(mask.scalar_type(), at::kBool);
  const std::vector<bool> expected = {true, false, false, true, true, false, true};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(mask[static_cast<int64_t>(i)].item<bool>(), expected[i]) << i;
  }
  // A bfloat16 param against a float32 update.
  EXPECT_TRUE(at::equal(cautious_decay_mask(update, param.to(at::kBFloat16)), mask));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
