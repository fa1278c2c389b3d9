// Muon tests. Expected values are worked out by hand (momentum, scale, weight decay) or by an
// independent float64 reimplementation of docs/architecture.md §5 written below (reference_muon),
// never copied from Muon's own output.
#include "mixtrain/optim/muon.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/schema.h"
#include "mixtrain/optim/muon_config.h"
#include "mixtrain/optim/option_fields.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using torch::optim::OptimizerParamGroup;

at::Tensor random_normal(at::IntArrayRef shape, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen, at::kFloat);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// ---- momentum: 2x3 matrix, two steps, mu = 0.75 ----
// Hand derivation (g1, g2 below; every coefficient is a dyadic fraction, so float32 computes
// them exactly and the comparison is exact up to the 1e-6 we allow for lerp's formula):
//   sum:      buf1 = g1                 buf2 = 0.75 g1 + g2
//             nesterov u1 = 1.75 g1     u2 = g2 + 0.75 buf2 = 1.75 g2 + 0.5625 g1
//   ema:      buf1 = 0.25 g1            buf2 = 0.75 buf1 + 0.25 g2 = 0.1875 g1 + 0.25 g2
//             nesterov u = g + 0.75 (buf - g):  u1 = 0.4375 g1,  u2 = 0.4375 g2 + 0.140625 g1
//   ema_add:  buf as ema; nesterov u = g + 0.75 buf: u1 = 1.1875 g1, u2 = 1.1875 g2 + 0.140625 g1
// Without Nesterov u = buf.
struct MomentumCase {
  MomentumStyle style;
  bool nesterov;
  // u1 = k1 g1; u2 = k2a g1 + k2b g2; buf2 = b2a g1 + b2b g2
  double k1, k2a, k2b, b2a, b2b;
};

TEST(MuonMomentumTest, EachFormAndNesterovOnA2x3MatrixForTwoSteps) {
  const at::Tensor g1 = at::tensor({1.0f, -2.0f, 4.0f, 0.5f, 8.0f, -1.0f}).view({2, 3});
  const at::Tensor g2 = at::tensor({2.0f, 2.0f, -4.0f, 1.0f, 0.0f, 3.0f}).view({2, 3});
  const std::vector<MomentumCase> cases = {
      {MomentumStyle::kSum, true, 1.75, 0.5625, 1.75, 0.75, 1.0},
      {MomentumStyle::kSum, false, 1.0, 0.75, 1.0, 0.75, 1.0},
      {MomentumStyle::kEma, true, 0.4375, 0.140625, 0.4375, 0.1875, 0.25},
      {MomentumStyle::kEma, false, 0.25, 0.1875, 0.25, 0.1875, 0.25},
      {MomentumStyle::kEmaAdd, true, 1.1875, 0.140625, 1.1875, 0.1875, 0.25},
      {MomentumStyle::kEmaAdd, false, 0.25, 0.1875, 0.25, 0.1875, 0.25},
  };
  for (const auto& c : cases) {
    const std::string what = momentum_style_name(c.style) + (c.nesterov ? " nesterov" : "");
    at::Tensor buf = at::zeros({2, 3});
    const at::Tensor u1 = muon_momentum_update(buf, g1, 0.75, c.style, c.nesterov);
    EXPECT_LT(max_abs_diff(u1, c.k1 * g1), 1e-6) << what;
    const at::Tensor u2 = muon_momentum_update(buf, g2, 0.75, c.style, c.nesterov);
    EXPECT_LT(max_abs_diff(u2, c.k2a * g1 + c.k2b * g2), 1e-6) << what;
    EXPECT_LT(max_abs_diff(buf, c.b2a * g1 + c.b2b * g2), 1e-6) << what;
  }
}

TEST(MuonMomentumTest, LowPrecisionGradAccumulatesInTheBufferDtype) {
  at::Tensor buf = at::zeros({2, 2});
  const at::Tensor g = at::full({2, 2}, 3.0, at::kBFloat16);
  const at::Tensor u = muon_momentum_update(buf, g, 0.5, MomentumStyle::kSum, true);
  EXPECT_EQ(buf.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(u, at::full({2, 2}, 4.5f)));  // 3 + 0.5 * 3
}

TEST(MuonMomentumTest, ParsesStyleAndLrModeNames) {
  EXPECT_EQ(parse_momentum_style("sum"), MomentumStyle::kSum);
  EXPECT_EQ(parse_momentum_style("ema"), MomentumStyle::kEma);
  EXPECT_EQ(parse_momentum_style("ema_add"), MomentumStyle::kEmaAdd);
  EXPECT_THROW(parse_momentum_style("nesterov"), std::invalid_argument);
  EXPECT_EQ(parse_adjust_lr_fn("original"), AdjustLrFn::kOriginal);
  EXPECT_EQ(parse_adjust_lr_fn("match_rms_adamw"), AdjustLrFn::kMatchRmsAdamw);
  EXPECT_THROW(parse_adjust_lr_fn("spectral"), std::invalid_argument);
  EXPECT_EQ(adjust_lr_fn_name(AdjustLrFn::kMatchRmsAdamw), "match_rms_adamw");
}

// ---- scale: by hand ----
// tall 8x2:  original sqrt(max(1, 4)) = 2;      match_rms_adamw 0.2 sqrt(8) = 0.565685...
// wide 2x8:  original sqrt(max(1, 1/4)) = 1;    match_rms_adamw 0.2 sqrt(8)
// 3-D [3, 9, 4] uses its last two dims 9x4: original sqrt(9/4) = 1.5; match 0.18 sqrt(9) = 0.54
TEST(MuonScaleTest, TallWideAndExpertShapes) {
  EXPECT_DOUBLE_EQ(muon_update_scale(8, 2, AdjustLrFn::kOriginal, 0.2), 2.0);
  EXPECT_DOUBLE_EQ(muon_update_scale(8, 2, AdjustLrFn::kMatchRmsAdamw, 0.2), 0.2 * std::sqrt(8.0));
  EXPECT_DOUBLE_EQ(muon_update_scale(2, 8, AdjustLrFn::kOriginal, 0.2), 1.0);
  EXPECT_DOUBLE_EQ(muon_update_scale(2, 8, AdjustLrFn::kMatchRmsAdamw, 0.2), 0.2 * std::sqrt(8.0));
  EXPECT_DOUBLE_EQ(muon_update_scale(9, 4, AdjustLrFn::kOriginal, 0.18), 1.5);
  EXPECT_DOUBLE_EQ(muon_update_scale(9, 4, AdjustLrFn::kMatchRmsAdamw, 0.18), 0.54);
}

// ---- update: by hand ----
// p = [[1, 2], [3, 4]], O = [[0.5, -0.5], [1, 0]], lr 0.1, wd 0.5, scale 2:
// p *= 1 - 0.05  -> [[0.95, 1.9], [2.85, 3.8]];  p -= 0.2 O -> [[0.85, 2.0], [2.65, 3.8]]
// (float32 rounding of 0.95 x and the subtraction: 1e-6 on values below 4).
TEST(MuonApplyUpdateTest, DecoupledWeightDecayThenScaledStep) {
  at::Tensor p = at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({2, 2});
  const at::Tensor o = at::tensor({0.5f, -0.5f, 1.0f, 0.0f}).view({2, 2});
  muon_apply_update(p, o, 0.1, 0.5, 2.0);
  EXPECT_LT(max_abs_diff(p, at::tensor({0.85, 2.0, 2.65, 3.8}).view({2, 2})), 1e-6);
}

// A bfloat16 param takes a float32 O as p.add_(O, alpha) does: computed in float32, rounded
// once (after the weight decay multiply, which rounds on its own as in the reference).
TEST(MuonApplyUpdateTest, LowPrecisionParamRoundsOnce) {
  const at::Tensor start = random_normal({4, 4}, 11).to(at::kBFloat16);
  const at::Tensor o = random_normal({4, 4}, 12);
  at::Tensor p = start.clone();
  muon_apply_update(p, o, 0.01, 0.1, 1.5);
  const at::Tensor decayed = (start.to(at::kDouble) * (1 - 0.001)).to(at::kBFloat16);
  const at::Tensor expected =
      (decayed.to(at::kDouble) - 0.015 * o.to(at::kDouble)).to(at::kBFloat16);
  // Both roundings are to nearest even of values computed exactly enough (float32 vs float64
  // intermediates can differ only for ties within 2^-24 relative, absent on random data).
  EXPECT_TRUE(at::equal(p, expected));
}

// ---- independent float64 reference of one Muon step (docs/architecture.md §5) ----
constexpr std::array<std::array<double, 3>, 5> kAsym5 = {{{4.0848, -6.8946, 2.9270},
                                                          {3.9505, -6.3029, 2.6377},
                                                          {3.7418, -5.5913, 2.3037},
                                                          {2.8769, -3.1427, 1.2046},
                                                          {2.8366, -3.0525, 1.2012}}};

at::Tensor reference_orthogonalize(const at::Tensor& m, double eps) {
  const bool tall = m.size(0) > m.size(1);
  at::Tensor x = tall ? m.t() : m;
  x = x / (std::sqrt((x * x).sum().item<double>()) + eps);
  for (const auto& [a, b, c] : kAsym5) {
    const at::Tensor gram = x.mm(x.t());
    x = a * x + (b * gram + c * gram.mm(gram)).mm(x);
  }
  return tall ? x.t() : x;
}

struct ReferenceParam {
  at::Tensor p;    // float64
  at::Tensor buf;  // float64
};

// One step with momentum `style`, asym5 x5, eps 1e-7, match_rms_adamw with rms, on float64.
void reference_step(ReferenceParam& r, const at::Tensor& grad, double lr, double wd, double mu,
                    MomentumStyle style, bool nesterov, double rms) {
  const at::Tensor g = grad.to(at::kDouble);
  at::Tensor u;
  if (style == MomentumStyle::kSum) {
    r.buf = mu * r.buf + g;
    u = nesterov ? g + mu * r.buf : r.buf;
  } else {
    r.buf = r.buf + (1 - mu) * (g - r.buf);
    if (!nesterov) {
      u = r.buf;
    } else {
      u = style == MomentumStyle::kEma ? g + mu * (r.buf - g) : g + mu * r.buf;
    }
  }
  const int64_t rows = r.p.size(-2), cols = r.p.size(-1);
  const at::Tensor matrices = u.reshape({-1, rows, cols});
  std::vector<at::Tensor> orthogonal;
  for (int64_t i = 0; i < matrices.size(0); ++i) {
    orthogonal.push_back(reference_orthogonalize(matrices[i], 1e-7));
  }
  const at::Tensor o = at::stack(orthogonal).view(r.p.sizes());
  const double scale = rms * std::sqrt(static_cast<double>(std::max(rows, cols)));
  r.p = r.p * (1 - lr * wd) - lr * scale * o;
}

// Tolerance of a step against the float64 reference, per element of p and per step, in units
// of lr*scale (one update element is lr*scale*O with |O| <~ 1):
//   float32 NS: float32 rounding of O through 5 steps plus the float32 rounding of p ~ 1
//     (1.2e-7 per step, which alone is ~1.2e-5 lr*scale here): 1e-4 lr*scale + 1e-6
//     (measured: <= 4.2e-5 lr*scale after two steps);
//   bfloat16 NS: the elementwise error of bf16 Newton-Schulz: its singular values may sit up to
//     ~0.06 outside asym5's exact band (newton_schulz_test) and its singular vectors carry bf16
//     rounding: 0.12 lr*scale (measured: <= 0.04 lr*scale after one step, 0.083 after two).
double step_tolerance(c10::ScalarType ns_dtype, double lr_scale, int steps) {
  return steps * (ns_dtype == at::kFloat ? 1e-4 * lr_scale + 1e-6 : 0.12 * lr_scale);
}

struct FullStepCase {
  MomentumStyle style;
  bool nesterov;
};

TEST(MuonStepTest, MatchesAnIndependentFloat64Reference) {
  const double lr = 0.02, wd = 0.1, mu = 0.95, rms = 0.2;
  for (const auto ns_dtype : {at::kFloat, at::kBFloat16}) {
    for (const FullStepCase c :
         {FullStepCase{MomentumStyle::kSum, true}, FullStepCase{MomentumStyle::kEma, true},
          FullStepCase{MomentumStyle::kEmaAdd, false}}) {
      const std::string what = std::string(c10::toString(ns_dtype)) + " " +
                               momentum_style_name(c.style) + (c.nesterov ? " nesterov" : "");
      // A wide matrix and a 3-D tall-expert tensor.
      at::Tensor wide = random_normal({4, 6}, 21);
      at::Tensor experts = random_normal({2, 5, 3}, 22);
      ReferenceParam ref_wide{wide.to(at::kDouble), at::zeros({4, 6}, at::kDouble)};
      ReferenceParam ref_experts{experts.to(at::kDouble), at::zeros({2, 5, 3}, at::kDouble)};
      Muon muon({wide, experts}, MuonOptions()
                                     .lr(lr)
                                     .weight_decay(wd)
                                     .momentum(mu)
                                     .nesterov(c.nesterov)
                                     .momentum_style(c.style)
                                     .ns_dtype(ns_dtype)
                                     .matched_adamw_rms(rms));
      for (int step = 1; step <= 2; ++step) {
        const at::Tensor g_wide = random_normal({4, 6}, 100 + step);
        const at::Tensor g_experts = random_normal({2, 5, 3}, 200 + step);
        wide.mutable_grad() = g_wide;
        experts.mutable_grad() = g_experts;
        muon.step();
        reference_step(ref_wide, g_wide, lr, wd, mu, c.style, c.nesterov, rms);
        reference_step(ref_experts, g_experts, lr, wd, mu, c.style, c.nesterov, rms);
        const double scale_wide = rms * std::sqrt(6.0), scale_experts = rms * std::sqrt(5.0);
        EXPECT_LT(max_abs_diff(wide, ref_wide.p), step_tolerance(ns_dtype, lr * scale_wide, step))
            << what << " step " << step;
        EXPECT_LT(max_abs_diff(experts, ref_experts.p),
                  step_tolerance(ns_dtype, lr * scale_experts, step))
            << what << " step " << step;
      }
      // The momentum buffer has no Newton-Schulz in it: float32 exact to rounding.
      EXPECT_LT(max_abs_diff(muon.export_state(wide)[0].second, ref_wide.buf), 1e-5) << what;
    }
  }
}

// ---- NorMuon and cautious weight decay against the formulas in float64 ----
// Continues reference_step's O (sum momentum, Nesterov, asym5) with NorMuon (arXiv 2510.05491:
// v = b2 v + (1-b2) mean_j O_ij^2, Ohat = O / (sqrt(v) + eps), update = Ohat ||O||_F /
// (||Ohat||_F + eps) per matrix) and, if cautious, the decay only where O_ij p_ij >= 0 (arXiv
// 2510.12402, with p before the step). Returns max_i of the row gain ||O||_F / ((sqrt(v_i) +
// eps)(||Ohat||_F + eps)), for the tolerance.
struct NorMuonReference {
  at::Tensor p, buf, v;  // float64
};

double reference_normuon_step(NorMuonReference& r, const at::Tensor& grad, double lr, double wd,
                              double mu, double beta2, bool cautious, double rms) {
  const at::Tensor g = grad.to(at::kDouble);
  r.buf = mu * r.buf + g;
  const at::Tensor u = g + mu * r.buf;
  const int64_t rows = r.p.size(-2), cols = r.p.size(-1);
  const at::Tensor matrices = u.reshape({-1, rows, cols});
  const at::Tensor v = r.v.view({-1, rows});
  std::vector<at::Tensor> updates;
  double gain = 0.0;
  for (int64_t i = 0; i < matrices.size(0); ++i) {
    const at::Tensor o = reference_orthogonalize(matrices[i], 1e-7);
    v[i].copy_(beta2 * v[i] + (1 - beta2) * (o * o).sum(1) / static_cast<double>(cols));
    const at::Tensor denominator = v[i].sqrt() + 1e-10;
    const at::Tensor hat = o / denominator.unsqueeze(1);
    const double ratio = std::sqrt((o * o).sum().item<double>()) /
                         (std::sqrt((hat * hat).sum().item<double>()) + 1e-10);
    gain = std::max(gain, ratio / denominator.min().item<double>());
    updates.push_back(hat * ratio);
  }
  const at::Tensor update = at::stack(updates).view(r.p.sizes());
  const double scale = rms * std::sqrt(static_cast<double>(std::max(rows, cols)));
  const at::Tensor decay =
      cautious ? at::where(update * r.p >= 0, 1 - lr * wd, 1.0) : at::full_like(r.p, 1 - lr * wd);
  r.p = r.p * decay - lr * scale * update;
  return gain;
}

// Tolerance: the float32 one of step_tolerance (in units of lr*scale*|O|) times the largest row
// gain (NorMuon multiplies O's row i by it) times 3: a relative error d of O moves O_ij by d,
// sqrt(v_i) by d (v is quadratic in O, the root halves it) and the norm ratio by d.
// Measured: under 2% of it. A cautious mask that flips where float32 and float64 disagree on
// a sign would cost lr*wd*|p| (~2e-3, far above); random data puts no |O_ij| that close to 0.
TEST(MuonNorMuonTest, StepsMatchTheFormulasInFloat64WithAndWithoutCautiousDecay) {
  const double lr = 0.02, wd = 0.1, mu = 0.95, beta2 = 0.95, rms = 0.2;
  for (const bool cautious : {false, true}) {
    at::Tensor wide = random_normal({4, 6}, 31);
    at::Tensor experts = random_normal({2, 5, 3}, 32);
    NorMuonReference ref_wide{wide.to(at::kDouble), at::zeros({4, 6}, at::kDouble),
                              at::zeros({4}, at::kDouble)};
    NorMuonReference ref_experts{experts.to(at::kDouble), at::zeros({2, 5, 3}, at::kDouble),
                                 at::zeros({2, 5}, at::kDouble)};
    Muon muon({wide, experts}, MuonOptions()
                                   .lr(lr)
                                   .weight_decay(wd)
                                   .momentum(mu)
                                   .ns_dtype(at::kFloat)
                                   .normuon(true)
                                   .normuon_beta2(beta2)
                                   .cautious_weight_decay(cautious));
    double tolerance_wide = 0.0, tolerance_experts = 0.0;
    for (int step = 1; step <= 3; ++step) {
      const at::Tensor g_wide = random_normal({4, 6}, 300 + step);
      const at::Tensor g_experts = random_normal({2, 5, 3}, 400 + step);
      wide.mutable_grad() = g_wide;
      experts.mutable_grad() = g_experts;
      muon.step();
      const double gain_wide =
          reference_normuon_step(ref_wide, g_wide, lr, wd, mu, beta2, cautious, rms);
      const double gain_experts =
          reference_normuon_step(ref_experts, g_experts, lr, wd, mu, beta2, cautious, rms);
      tolerance_wide += 3 * gain_wide * step_tolerance(at::kFloat, lr * rms * std::sqrt(6.0), 1);
      tolerance_experts +=
          3 * gain_experts * step_tolerance(at::kFloat, lr * rms * std::sqrt(5.0), 1);
      const std::string what =
          std::string(cautious ? "cautious" : "plain") + " step " + std::to_string(step);
      EXPECT_LT(max_abs_diff(wide, ref_wide.p), tolerance_wide) << what;
      EXPECT_LT(max_abs_diff(experts, ref_experts.p), tolerance_experts) << what;
    }
    // The state: one float32 value per row (per expert row for the 3-D tensor).
    const NamedTensorList state = muon.export_state(experts);
    ASSERT_EQ(state.size(), 3u);
    EXPECT_EQ(state[2].first, "normuon_v");
    EXPECT_EQ(state[2].second.scalar_type(), at::kFloat);
    EXPECT_EQ(state[2].second.sizes(), (at::IntArrayRef{2, 5}));
    EXPECT_LT(max_abs_diff(state[2].second, ref_experts.v),
              1e-4 * ref_experts.v.abs().max().item<double>());
  }
}

// Per-head with NorMuon: NorMuon runs on the merged O (the heads' O joined back into the
// matrix as stored), so v is per row of the parameter and the norm-preserving rescale is of the
// whole matrix. Written out for one step from v = 0, in float64, each head's O from
// reference_orthogonalize (not the code under test): v = (1 - 0.95) * mean_j O_ij^2,
// Ohat = O / (sqrt(v) + eps), update = Ohat * ||O||_F / (||Ohat||_F + eps). Muon runs
// Newton-Schulz in float32, so the bound is the NorMuon test's above: 3 x the largest row gain
// x step_tolerance(float32) per lr*scale (q's heads 0.1, o's 0.1 sqrt(20/8)). v (~2e-3): a
// float32 O is off by <= 1e-4 per element (step_tolerance in units of lr*scale) on elements of
// about 1/sqrt(20) ~ 0.2, so v, a row mean of squares, by <= ~1e-3 relative. NorMuon per head
// block instead (a rescale per block) would move q by > 1e-4, more than 3x the bound for q,
// checked so the test tells the two apart.
TEST(MuonPerHeadTest, NorMuonNormalizesTheMergedMatrix) {
  const MuonOptions options =
      MuonOptions().lr(0.1).ns_dtype(at::kFloat).adjust_lr_fn(AdjustLrFn::kOriginal).normuon(true);
  at::Tensor q = random_normal({24, 20}, 171), o = random_normal({20, 24}, 172);
  const at::Tensor q0 = q.clone(), o0 = o.clone();
  Muon muon({q, o}, options);
  muon.set_head_split(q, {0, 8});
  muon.set_head_split(o, {1, 8});
  const at::Tensor gq = random_normal({24, 20}, 181), go = random_normal({20, 24}, 182);
  q.mutable_grad() = gq;
  o.mutable_grad() = go;
  muon.step();

  auto ns = [](const at::Tensor& u) { return reference_orthogonalize(u.to(at::kDouble), 1e-7); };
  // buf = g; u = g + mu*buf, in float64.
  auto u_of = [](const at::Tensor& g) { return g.to(at::kDouble) * (1 + 0.95); };
  struct NorMuonUpdate {
    at::Tensor update, v;
    double
        gain;  // max_i ||O||_F / ((sqrt(v_i) + eps)(||Ohat||_F + eps)), as reference_normuon_step
  };
  auto normuon = [](const at::Tensor& merged) {
    const at::Tensor v = merged.square().mean(-1) * (1 - 0.95);
    const at::Tensor denominator = v.sqrt() + 1e-10;
    const at::Tensor hat = merged / denominator.unsqueeze(-1);
    const double ratio = merged.norm().item<double>() / (hat.norm().item<double>() + 1e-10);
    return NorMuonUpdate{hat * ratio, v, ratio / denominator.min().item<double>()};
  };
  at::Tensor merged_q = at::empty(q0.sizes(), at::kDouble);
  at::Tensor merged_o = at::empty(o0.sizes(), at::kDouble);
  for (int64_t h = 0; h < 3; ++h) {
    merged_q.narrow(0, 8 * h, 8).copy_(ns(u_of(gq).narrow(0, 8 * h, 8)));
    merged_o.narrow(1, 8 * h, 8).copy_(ns(u_of(go).narrow(1, 8 * h, 8)));
  }
  const NorMuonUpdate ref_q = normuon(merged_q), ref_o = normuon(merged_o);
  // Scales of the head shapes: q's 8 x 20 heads 1, o's 20 x 8 heads sqrt(20/8).
  const double lr_scale_q = 0.1, lr_scale_o = 0.1 * std::sqrt(20.0 / 8);
  const double bound_q = 3 * ref_q.gain * step_tolerance(at::kFloat, lr_scale_q, 1);
  const double bound_o = 3 * ref_o.gain * step_tolerance(at::kFloat, lr_scale_o, 1);
  const double diff_q = max_abs_diff(q, q0.to(at::kDouble) - lr_scale_q * ref_q.update);
  const double diff_o = max_abs_diff(o, o0.to(at::kDouble) - lr_scale_o * ref_o.update);
  std::cout << "q: " << diff_q << " (bound " << bound_q << "), o: " << diff_o << " (bound "
            << bound_o << ")\n";
  EXPECT_LT(diff_q, bound_q);
  EXPECT_LT(diff_o, bound_o);
  EXPECT_LT(max_abs_diff(muon.export_state(q).at(2).second, ref_q.v),
            1e-3 * ref_q.v.max().item<double>());
  EXPECT_LT(max_abs_diff(muon.export_state(o).at(2).second, ref_o.v),
            1e-3 * ref_o.v.max().item<double>());
  at::Tensor per_block = at::empty_like(merged_q);
  for (int64_t h = 0; h < 3; ++h) {
    per_block.narrow(0, 8 * h, 8).copy_(normuon(merged_q.narrow(0, 8 * h, 8)).update);
  }
  const double per_block_diff = max_abs_diff(q, q0.to(at::kDouble) - lr_scale_q * per_block);
  EXPECT_GT(per_block_diff, 1e-4);
  EXPECT_GT(per_block_diff, 3 * bound_q);
}

// p = [[1, -2], [3, -4]], O = [[0.5, 0.5], [-1, 0]], lr 0.1, wd 0.5, scale 2, cautious:
// O*p = [[0.5, -1], [-3, 0]] >= 0 -> decay (x 0.95) at (0,0) and (1,1) only:
// [[0.95, -2], [3, -3.8]]; p -= 0.2 O -> [[0.85, -2.1], [3.2, -3.8]].
TEST(MuonApplyUpdateTest, CautiousDecayOnlyWhereSignsAgreeOrAZero) {
  at::Tensor p = at::tensor({1.0f, -2.0f, 3.0f, -4.0f}).view({2, 2});
  const at::Tensor o = at::tensor({0.5f, 0.5f, -1.0f, 0.0f}).view({2, 2});
  muon_apply_update(p, o, 0.1, 0.5, 2.0, /*cautious=*/true);
  EXPECT_LT(max_abs_diff(p, at::tensor({0.85, -2.1, 3.2, -3.8}).view({2, 2})), 1e-6);
  // Where the mask holds, the bits of the plain decay; elsewhere p is untouched by it.
  const at::Tensor start = random_normal({8, 8}, 41);
  const at::Tensor update = random_normal({8, 8}, 42);
  at::Tensor cautious = start.clone(), plain = start.clone();
  muon_apply_update(cautious, update, 0.01, 0.3, 0.0, true);
  muon_apply_update(plain, update, 0.01, 0.3, 0.0, false);
  const at::Tensor mask = (update.to(at::kDouble) * start.to(at::kDouble)) >= 0;
  EXPECT_TRUE(at::equal(at::where(mask, plain, start), cautious));
  EXPECT_GT(mask.sum().item<int64_t>(), 0);
  EXPECT_LT(mask.sum().item<int64_t>(), 64);
}

// NorMuon's v is checkpoint state: exported, imported (shape checked: one value per row), and a
// resumed optimizer continues bitwise; also through the fused / unfused apply (cautious).
TEST(MuonNorMuonTest, StateExportImportContinuesBitwise) {
  for (const bool cautious : {false, true}) {
    const MuonOptions options =
        MuonOptions().weight_decay(0.1).normuon(true).cautious_weight_decay(cautious);
    at::Tensor p = random_normal({5, 7}, 51);
    Muon muon({p}, options);
    for (int step = 1; step <= 2; ++step) {
      p.mutable_grad() = random_normal({5, 7}, 51 + step);
      muon.step();
    }
    const NamedTensorList exported = muon.export_state(p);
    ASSERT_EQ(exported.size(), 3u);
    EXPECT_EQ(exported[2].first, "normuon_v");
    EXPECT_EQ(exported[2].second.sizes(), (at::IntArrayRef{5}));
    EXPECT_GT(exported[2].second.min().item<float>(), 0.0f);

    at::Tensor restored = p.clone();
    Muon resumed({restored}, options);
    resumed.import_state(restored, exported);
    EXPECT_FALSE(resumed.export_state(restored)[2].second.is_same(exported[2].second));
    const at::Tensor g = random_normal({5, 7}, 59);
    p.mutable_grad() = g;
    restored.mutable_grad() = g.clone();
    muon.step();
    resumed.step();
    EXPECT_TRUE(at::equal(p, restored)) << cautious;
    EXPECT_TRUE(
        at::equal(muon.export_state(p)[2].second, resumed.export_state(restored)[2].second));

    // The same momentum and step without v (started as zeros): the next step differs.
    at::Tensor fresh = restored.clone();
    Muon no_v({fresh}, options);
    const NamedTensorList now = resumed.export_state(restored);
    no_v.import_state(fresh, {now[0], now[1]});
    fresh.mutable_grad() = random_normal({5, 7}, 60);
    restored.mutable_grad() = fresh.grad().clone();
    no_v.step();
    resumed.step();
    EXPECT_FALSE(at::equal(fresh, restored));

    EXPECT_THROW(resumed.import_state(restored,
                                      {exported[0], exported[1], {"normuon_v", at::zeros({5, 7})}}),
                 std::invalid_argument);
    EXPECT_THROW(
        resumed.import_state(restored, {exported[0], exported[1], {"normuon_v", at::zeros({7})}}),
        std::invalid_argument);
  }
}

// original mode on a tall matrix: scale sqrt(6/2) and lr as given; checked through the update
// size, which for an exactly orthogonalized full-rank tall matrix has every singular value of
// O near 1 (hybrid10: within 6e-4 of 1 in float32), so ||delta p||_2 ~ lr * sqrt(3).
TEST(MuonStepTest, OriginalModeScalesTallMatricesBySqrtAspect) {
  at::Tensor p = at::zeros({6, 2});
  Muon muon({p}, MuonOptions()
                     .lr(0.1)
                     .adjust_lr_fn(AdjustLrFn::kOriginal)
                     .ns_variant("hybrid")
                     .ns_steps(10)
                     .ns_dtype(at::kFloat));
  p.mutable_grad() = random_normal({6, 2}, 31);
  muon.step();
  const at::Tensor s = at::linalg_svdvals(p.to(at::kDouble));
  EXPECT_NEAR(s.max().item<double>(), 0.1 * std::sqrt(3.0), 1e-3);
  EXPECT_NEAR(s.min().item<double>(), 0.1 * std::sqrt(3.0), 1e-3);
}

// ---- batching ----
// Two 6x4 matrices and a [3, 6, 4] expert tensor share one Newton-Schulz call (5 matrices); each
// alone in its own Muon must give the same update. float32: the same per-matrix GEMMs, so equal
// to float32 rounding (1e-6 on p ~ 1). bfloat16: batched and single GEMMs may take different
// oneDNN/cpublas paths and round differently (on other shapes a 4 x 24 x 16 batch and its single
// matrices differ by up to 0.07 per element of O after 5 steps); Newton-Schulz amplifies that
// like any rounding, so the two may differ by up to twice the bf16 step tolerance against the
// exact result. Measured here with LibTorch 1.13: bitwise equal in both dtypes.
TEST(MuonBatchTest, SameShapeBatchEqualsPerParameterSteps) {
  for (const auto ns_dtype : {at::kFloat, at::kBFloat16}) {
    const MuonOptions options = MuonOptions().lr(0.05).weight_decay(0.01).ns_dtype(ns_dtype);
    std::vector<at::Tensor> batched = {random_normal({6, 4}, 41), random_normal({6, 4}, 42),
                                       random_normal({3, 6, 4}, 43), random_normal({5, 5}, 44)};
    std::vector<at::Tensor> single;
    for (const auto& p : batched) single.push_back(p.clone());
    Muon together(batched, options);
    std::vector<std::unique_ptr<Muon>> alone;
    for (const auto& p : single) alone.push_back(std::make_unique<Muon>(std::vector{p}, options));

    const auto layout = together.batches(0);
    ASSERT_EQ(layout.size(), 2u);
    EXPECT_EQ(layout[0].rows, 6);
    EXPECT_EQ(layout[0].cols, 4);
    EXPECT_EQ(layout[0].params.size(), 3u);
    EXPECT_EQ(layout[1].params.size(), 1u);

    for (int step = 1; step <= 2; ++step) {
      for (size_t i = 0; i < batched.size(); ++i) {
        const at::Tensor g = random_normal(batched[i].sizes(), 1000 * step + i);
        batched[i].mutable_grad() = g;
        single[i].mutable_grad() = g.clone();
      }
      together.step();
      for (auto& m : alone) m->step();
    }
    const double scale = 0.2 * std::sqrt(6.0);
    const double tol =
        ns_dtype == at::kFloat ? 1e-6 : 2 * step_tolerance(ns_dtype, 0.05 * scale, 2);
    for (size_t i = 0; i < batched.size(); ++i) {
      EXPECT_LT(max_abs_diff(batched[i], single[i]), tol)
          << c10::toString(ns_dtype) << " param " << i;
    }
  }
}

// A same-shape batch larger than one Newton-Schulz call goes in slices of whole parameters (two
// [1000, 64, 32] tensors fit one call of 2048 bf16 matrices, the third goes alone): each param
// ends as if it had been stepped alone, to the tolerance of the test above.
TEST(MuonBatchTest, BatchesLargerThanOneCallGoInSlicesOfWholeParameters) {
  const MuonOptions options = MuonOptions().lr(0.05).ns_dtype(at::kBFloat16);
  ASSERT_EQ(newton_schulz_matrices_per_call(64, 32, at::kBFloat16), 2048);
  std::vector<at::Tensor> batched = {random_normal({1000, 64, 32}, 61),
                                     random_normal({1000, 64, 32}, 62),
                                     random_normal({1000, 64, 32}, 63)};
  std::vector<at::Tensor> single;
  for (const auto& p : batched) single.push_back(p.clone());
  Muon together(batched, options);
  std::vector<std::unique_ptr<Muon>> alone;
  for (const auto& p : single) alone.push_back(std::make_unique<Muon>(std::vector{p}, options));
  for (size_t i = 0; i < batched.size(); ++i) {
    const at::Tensor g = random_normal(batched[i].sizes(), 2000 + i);
    batched[i].mutable_grad() = g;
    single[i].mutable_grad() = g.clone();
  }
  together.step();
  for (auto& m : alone) m->step();
  const double tol = 2 * step_tolerance(at::kBFloat16, 0.05 * 0.2 * std::sqrt(64.0), 1);
  for (size_t i = 0; i < batched.size(); ++i) {
    EXPECT_LT(max_abs_diff(batched[i], single[i]), tol) << "param " << i;
  }
}

// ---- parameter replacement (fp32-main-params §7.3) ----
TEST(MuonReplaceTest, StateMovesAndRebuiltBatchesUpdateTheNewTensor) {
  const MuonOptions options = MuonOptions().ns_dtype(at::kFloat);
  at::Tensor old_param = random_normal({4, 8}, 51);
  at::Tensor twin = old_param.clone();  // same history, never replaced
  Muon muon({old_param}, options);
  Muon reference({twin}, options);
  const at::Tensor g1 = random_normal({4, 8}, 52);
  old_param.mutable_grad() = g1;
  twin.mutable_grad() = g1.clone();
  muon.step();
  reference.step();

  at::Tensor new_param = old_param.detach().clone();
  const at::Tensor old_before = old_param.clone();
  muon.replace_parameter(old_param, new_param);
  muon.reset_parameter_caches();
  EXPECT_TRUE(muon.export_state(old_param).empty());
  ASSERT_EQ(muon.export_state(new_param).size(), 2u);
  ASSERT_EQ(muon.batches(0).size(), 1u);
  EXPECT_TRUE(muon.batches(0)[0].params[0].is_same(new_param));

  const at::Tensor g2 = random_normal({4, 8}, 53);
  new_param.mutable_grad() = g2;
  twin.mutable_grad() = g2.clone();
  muon.step();
  reference.step();
  EXPECT_TRUE(at::equal(old_param, old_before));  // the replaced tensor is left alone
  EXPECT_TRUE(at::equal(new_param, twin));        // same computation on the same values
  EXPECT_EQ(muon.export_state(new_param)[1].second.item<int64_t>(), 2);
}

// Forgetting reset_parameter_caches() must not update the replaced tensor either.
TEST(MuonReplaceTest, StepRebuildsStaleBatches) {
  at::Tensor old_param = random_normal({3, 3}, 61);
  Muon muon({old_param}, MuonOptions().ns_dtype(at::kFloat));
  at::Tensor new_param = old_param.clone();
  muon.replace_parameter(old_param, new_param);
  new_param.mutable_grad() = random_normal({3, 3}, 62);
  const at::Tensor old_before = old_param.clone();
  muon.step();
  EXPECT_TRUE(at::equal(old_param, old_before));
  EXPECT_FALSE(at::equal(new_param, old_before));
}

// ---- state export / import ----
TEST(MuonStateTest, ExportImportContinuesBitwise) {
  const MuonOptions options = MuonOptions().weight_decay(0.1);
  at::Tensor p = random_normal({5, 7}, 71);
  Muon muon({p}, options);
  EXPECT_TRUE(muon.export_state(p).empty());  // no state before the first step
  for (int step = 1; step <= 2; ++step) {
    p.mutable_grad() = random_normal({5, 7}, 71 + step);
    muon.step();
  }
  const NamedTensorList exported = muon.export_state(p);
  ASSERT_EQ(exported.size(), 2u);
  EXPECT_EQ(exported[0].first, "momentum_buffer");
  EXPECT_EQ(exported[1].first, "step");
  EXPECT_EQ(exported[1].second.item<int64_t>(), 2);

  at::Tensor restored = p.clone();
  Muon resumed({restored}, options);
  resumed.import_state(restored, exported);
  EXPECT_FALSE(resumed.export_state(restored)[0].second.is_same(exported[0].second));  // a copy

  const at::Tensor g = random_normal({5, 7}, 79);
  p.mutable_grad() = g;
  restored.mutable_grad() = g.clone();
  muon.step();
  resumed.step();
  EXPECT_TRUE(at::equal(p, restored));
  EXPECT_EQ(resumed.export_state(restored)[1].second.item<int64_t>(), 3);
}

TEST(MuonStateTest, ImportRejectsBadState) {
  at::Tensor p = at::zeros({2, 3});
  Muon muon({p});
  const at::Tensor buf = at::zeros({2, 3});
  const at::Tensor step = at::scalar_tensor(4.0);  // torch.optim's float32 step is accepted
  EXPECT_NO_THROW(muon.import_state(p, {{"momentum_buffer", buf}, {"step", step}}));
  EXPECT_EQ(muon.export_state(p)[1].second.item<int64_t>(), 4);
  EXPECT_THROW(muon.import_state(p, {{"step", step}}), std::invalid_argument);
  EXPECT_THROW(muon.import_state(p, {{"momentum_buffer", buf}}), std::invalid_argument);
  EXPECT_THROW(muon.import_state(p, {{"momentum_buffer", buf}, {"step", step}, {"exp_avg", buf}}),
               std::invalid_argument);
  EXPECT_THROW(muon.import_state(p, {{"momentum_buffer", at::zeros({3, 2})}, {"step", step}}),
               std::invalid_argument);
  EXPECT_THROW(muon.import_state(p, {{"momentum_buffer", buf}, {"step", at::scalar_tensor(1.5)}}),
               std::invalid_argument);
  EXPECT_THROW(muon.import_state(at::zeros({2, 3}), {{"momentum_buffer", buf}, {"step", step}}),
               std::invalid_argument);
}

// ---- copy-back ----
TEST(MuonCopyBackTest, ModelParamIsTheMainParamRoundedToBfloat16) {
  at::Tensor model = random_normal({6, 10}, 81).to(at::kBFloat16);
  at::Tensor main = model.to(at::kFloat);
  Muon muon({main}, MuonOptions().lr(0.01).weight_decay(0.1));
  muon.set_copy_back(main, model);
  for (int step = 1; step <= 3; ++step) {
    main.mutable_grad() = random_normal({6, 10}, 81 + step);
    muon.step();
    EXPECT_EQ(model.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(model, main.to(at::kBFloat16))) << "step " << step;
  }
  EXPECT_FALSE(at::equal(model.to(at::kFloat), main));  // main keeps the low mantissa bits
}

// A float32 main param takes the fused kernels (kernels/muon_kernel.h); the public op sequence
// (muon_momentum_update, newton_schulz on u rounded to ns_dtype, muon_apply_update, the model
// param rounded from the main param) must give the same bits, for each momentum form, both
// Newton-Schulz dtypes, a 16-bit grad, and batched wide, tall and 3-D parameters.
TEST(MuonFusedTest, StepIsBitwiseThePublicOpSequence) {
  const double lr = 0.02, wd = 0.1, mu = 0.95;
  for (const auto ns_dtype : {at::kFloat, at::kBFloat16}) {
    for (const FullStepCase c :
         {FullStepCase{MomentumStyle::kSum, true}, FullStepCase{MomentumStyle::kEma, true},
          FullStepCase{MomentumStyle::kEmaAdd, true}, FullStepCase{MomentumStyle::kSum, false}}) {
      const std::string what = std::string(c10::toString(ns_dtype)) + " " +
                               momentum_style_name(c.style) + (c.nesterov ? " nesterov" : "");
      const std::vector<std::vector<int64_t>> shapes = {{16, 24}, {16, 24}, {40, 8}, {3, 8, 20}};
      std::vector<at::Tensor> params, models, ref_params, ref_bufs;
      for (size_t i = 0; i < shapes.size(); ++i) {
        params.push_back(random_normal(shapes[i], 300 + i));
        models.push_back(params.back().to(at::kBFloat16));
        ref_params.push_back(params.back().clone());
        ref_bufs.push_back(at::zeros(shapes[i]));
      }
      const MuonOptions options = MuonOptions()
                                      .lr(lr)
                                      .weight_decay(wd)
                                      .momentum(mu)
                                      .nesterov(c.nesterov)
                                      .momentum_style(c.style)
                                      .ns_dtype(ns_dtype);
      Muon muon(params, options);
      for (size_t i = 0; i < params.size(); ++i) muon.set_copy_back(params[i], models[i]);
      const auto schedule = newton_schulz_schedule("asym5", 5, {});
      for (int step = 1; step <= 3; ++step) {
        for (size_t i = 0; i < params.size(); ++i) {
          // bfloat16 grads on odd steps: the kernel widens them as grad.to(float32) does.
          at::Tensor g = random_normal(shapes[i], 400 + 10 * step + i);
          if (step % 2 == 1) g = g.to(at::kBFloat16);
          params[i].mutable_grad() = g;
          const at::Tensor u = muon_momentum_update(ref_bufs[i], g, mu, c.style, c.nesterov);
          const at::Tensor o = newton_schulz(u.to(ns_dtype), schedule, 1e-7, ns_dtype);
          const int64_t rows = shapes[i][shapes[i].size() - 2];
          const int64_t cols = shapes[i].back();
          muon_apply_update(ref_params[i], o, lr, wd,
                            muon_update_scale(rows, cols, AdjustLrFn::kMatchRmsAdamw, 0.2));
        }
        muon.step();
        for (size_t i = 0; i < params.size(); ++i) {
          EXPECT_TRUE(at::equal(params[i], ref_params[i]))
              << what << " param " << i << " step " << step;
          EXPECT_TRUE(at::equal(muon.export_state(params[i])[0].second, ref_bufs[i]))
              << what << " buffer " << i << " step " << step;
          EXPECT_TRUE(at::equal(models[i], ref_params[i].to(at::kBFloat16)))
              << what << " model " << i << " step " << step;
        }
      }
    }
  }
}

// polar_express reaches newton_schulz with its input scaling (the norm times 1.02 for 5 steps,
// 1.01 for 8, written out here): bitwise the public sequence; for 5 steps the unscaled
// iteration gives other bits, so a step that dropped the scaling fails here.
TEST(MuonTest, PolarExpressStepsWithTheInputScaling) {
  const double lr = 0.02;
  for (const auto& [steps, scale] : {std::pair<int64_t, double>{5, 1.02}, {8, 1.01}}) {
    const std::vector<int64_t> shape = {16, 24};
    at::Tensor param = random_normal(shape, 700 + steps);
    at::Tensor ref = param.clone();
    Muon muon(
        {param},
        MuonOptions().lr(lr).ns_variant("polar_express").ns_steps(steps).ns_dtype(at::kFloat));
    const at::Tensor g = random_normal(shape, 800 + steps);
    param.mutable_grad() = g;
    at::Tensor buf = at::zeros(shape);
    const at::Tensor u = muon_momentum_update(buf, g, 0.95, MomentumStyle::kSum, true);
    const auto schedule = newton_schulz_schedule("polar_express", steps);
    const at::Tensor o = newton_schulz(u, schedule, 1e-7, at::kFloat, scale);
    const double update_scale = muon_update_scale(16, 24, AdjustLrFn::kMatchRmsAdamw, 0.2);
    muon_apply_update(ref, o, lr, 0.0, update_scale);
    muon.step();
    EXPECT_TRUE(at::equal(param, ref)) << steps << " steps";
    if (steps == 5) {
      EXPECT_FALSE(at::equal(o, newton_schulz(u, schedule, 1e-7, at::kFloat)));
    }
  }
}

// ---- construction, options, grads ----
TEST(MuonTest, RejectsVectorParameters) {
  try {
    Muon muon({at::zeros({3, 3}), at::zeros({4})});
    FAIL() << "a 1-D parameter must be rejected";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[4]"), std::string::npos) << e.what();
  }
}

TEST(MuonTest, RejectsInvalidOptions) {
  EXPECT_THROW(Muon({at::zeros({2, 2})}, MuonOptions().ns_steps(6)), std::invalid_argument);
  EXPECT_THROW(Muon({at::zeros({2, 2})}, MuonOptions().momentum(1.0)), std::invalid_argument);
  EXPECT_THROW(Muon({at::zeros({2, 2})}, MuonOptions().lr(-1.0)), std::invalid_argument);
  EXPECT_THROW(Muon({at::zeros({2, 2})}, MuonOptions().ns_dtype(at::kHalf)), std::invalid_argument);
  EXPECT_THROW(Muon({at::zeros({2, 2})}, MuonOptions().ns_variant("custom")),
               std::invalid_argument);  // custom needs ns_steps coefficient sets
  EXPECT_THROW(Muon({at::zeros({2, 2})}, MuonOptions().normuon_beta2(1.0)), std::invalid_argument);
  EXPECT_THROW(Muon({at::zeros({2, 2})}, MuonOptions().normuon_beta2(-0.1)), std::invalid_argument);
  EXPECT_THROW(Muon({at::zeros({2, 2})}, MuonOptions().normuon_epsilon(0.0)),
               std::invalid_argument);
}

TEST(MuonTest, DefaultsAreTheYamlDialects) {
  // hyper-parallel's Muon defaults (docs/config.md), stated here independently of muon.h.
  const MuonOptions d;
  EXPECT_EQ(d.lr(), 0.02);
  EXPECT_EQ(d.weight_decay(), 0.0);
  EXPECT_EQ(d.momentum(), 0.95);
  EXPECT_TRUE(d.nesterov());
  EXPECT_EQ(d.ns_steps(), 5);
  EXPECT_EQ(d.ns_variant(), "asym5");
  EXPECT_TRUE(d.ns_coefficients().empty());
  EXPECT_EQ(d.ns_epsilon(), 1e-7);
  EXPECT_EQ(d.ns_dtype(), at::kBFloat16);
  EXPECT_EQ(d.matched_adamw_rms(), 0.2);
  EXPECT_EQ(d.adjust_lr_fn(), AdjustLrFn::kMatchRmsAdamw);
  EXPECT_EQ(d.momentum_style(), MomentumStyle::kSum);
  EXPECT_EQ(d.communication_dtype(), at::kBFloat16);
  EXPECT_FALSE(d.normuon());
  EXPECT_EQ(d.normuon_beta2(), 0.95);  // the paper's beta2
  EXPECT_EQ(d.normuon_epsilon(), 1e-10);
  EXPECT_FALSE(d.cautious_weight_decay());
}

// Each option is declared once: its field gives the config key, the checkpoint field and the
// rule validate() applies.
TEST(MuonTest, OptionFieldsAreTheConfigKeysCheckpointFieldsAndRules) {
  std::set<std::string> hyper;
  for (const auto& field : muon_option_fields()) {
    const std::string key = "optimizer.muon_config.muon_" + field.name;
    const LeafSpec* leaf = find_canonical_leaf(key);
    ASSERT_NE(leaf, nullptr) << key;
    // The leaf shows what the options hold: a config at its defaults shows MuonOptions{}.
    EXPECT_EQ(leaf->format(TrainerConfig{}), field.show(MuonOptions{})) << key;
    if (field.hyperparameter) hyper.insert(field.name);
  }
  std::set<std::string> saved;
  Muon optimizer({at::zeros({2, 3})}, MuonOptions());
  const nlohmann::json group = optimizer.group_hyperparameters(0);
  for (const auto& item : group.items()) saved.insert(item.key());
  EXPECT_EQ(saved, hyper);
  EXPECT_EQ(hyper.count("lr"), 0u);  // the group's lr is saved as its base lr

  // A key set in a config reaches the options the optimizer is built from.
  TrainerConfig config;
  DocValue float32;
  float32.kind = DocValue::Kind::kString;
  float32.string_value = "float32";
  find_canonical_leaf("optimizer.muon_config.muon_ns_dtype")
      ->assign(config, float32, {"test", "optimizer.muon_config.muon_ns_dtype"});
  EXPECT_EQ(muon_config(config).options.ns_dtype(), at::kFloat);

  // validate() applies the fields' rules, naming the option.
  try {
    MuonOptions().momentum(1.0).validate();
    FAIL() << "momentum 1 was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_STREQ(error.what(), "Muon: momentum must be in [0, 1), got 1");
  }
  EXPECT_THROW(MuonOptions().ns_dtype(at::kChar).validate(), std::invalid_argument);
  EXPECT_THROW(MuonOptions().ns_variant("asym5").ns_steps(10).validate(), std::invalid_argument);
  MuonOptions().ns_dtype(at::kDouble).validate();  // float64: programs and checkpoints only
}

TEST(MuonTest, GroupHyperparametersRoundTripAndAreCheckedBeforeTheyAreSet) {
  Muon optimizer({at::zeros({2, 3})}, MuonOptions().lr(0.05));
  EXPECT_EQ(optimizer.group_hyperparameters(0), nlohmann::json::parse(R"({
    "weight_decay": 0.0, "momentum": 0.95, "nesterov": true, "ns_steps": 5,
    "ns_variant": "asym5", "ns_coefficients": [], "ns_epsilon": 1e-7, "ns_dtype": "bfloat16",
    "matched_adamw_rms": 0.2, "adjust_lr_fn": "match_rms_adamw", "momentum_style": "sum",
    "communication_dtype": "bfloat16", "normuon": false, "normuon_beta2": 0.95,
    "normuon_epsilon": 1e-10, "cautious_weight_decay": false})"));
  EXPECT_THROW(optimizer.group_hyperparameters(1), std::out_of_range);

  const nlohmann::json values = nlohmann::json::parse(R"({
    "weight_decay": 0.1, "momentum": 0.5, "nesterov": false, "ns_steps": 2,
    "ns_variant": "custom", "ns_coefficients": [[3.0, -3.2, 1.2], [2.0, -1.5, 0.5]],
    "ns_epsilon": 1e-5, "ns_dtype": "float64", "matched_adamw_rms": 0.18,
    "adjust_lr_fn": "original", "momentum_style": "ema_add", "communication_dtype": "float32",
    "normuon": true, "normuon_beta2": 0.9, "normuon_epsilon": 1e-8,
    "cautious_weight_decay": true})");
  optimizer.set_group_hyperparameters(0, values);
  const auto& o = static_cast<const MuonOptions&>(optimizer.param_groups()[0].options());
  EXPECT_EQ(o.lr(), 0.05);  // lr is not a hyper-parameter here
  EXPECT_EQ(o.weight_decay(), 0.1);
  EXPECT_EQ(o.momentum(), 0.5);
  EXPECT_FALSE(o.nesterov());
  EXPECT_EQ(o.ns_steps(), 2);
  EXPECT_EQ(o.ns_variant(), "custom");
  EXPECT_EQ(o.ns_coefficients(), (std::vector<NsCoefficients>{{3.0, -3.2, 1.2}, {2.0, -1.5, 0.5}}));
  EXPECT_EQ(o.ns_epsilon(), 1e-5);
  EXPECT_EQ(o.ns_dtype(), at::kDouble);
  EXPECT_EQ(o.matched_adamw_rms(), 0.18);
  EXPECT_EQ(o.adjust_lr_fn(), AdjustLrFn::kOriginal);
  EXPECT_EQ(o.momentum_style(), MomentumStyle::kEmaAdd);
  EXPECT_EQ(o.communication_dtype(), at::kFloat);
  EXPECT_TRUE(o.normuon());
  EXPECT_EQ(o.normuon_beta2(), 0.9);
  EXPECT_EQ(o.normuon_epsilon(), 1e-8);
  EXPECT_TRUE(o.cautious_weight_decay());
  EXPECT_EQ(optimizer.group_hyperparameters(0), values);

  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> bad = {
      {[](nlohmann::json& j) { j["ns_steps"] = 0; }, "ns_steps must be > 0, got 0"},
      {[](nlohmann::json& j) { j["ns_steps"] = 3; }, "custom Newton-Schulz schedule has 2"},
      {[](nlohmann::json& j) { j["ns_steps"] = 2.0; }, "field 'ns_steps' must be an integer"},
      {[](nlohmann::json& j) { j["ns_variant"] = "cubic"; },
       "ns_variant must be one of legacy, asym5, quintic, hybrid, polar_express, "
       "custom, got 'cubic'"},
      {[](nlohmann::json& j) {
         j["ns_coefficients"][1] = {2.0, -1.5};
       },
       "field 'ns_coefficients' must be an array of [a, b, c] number triples, got the element "
       "[2.0,-1.5]"},
      {[](nlohmann::json& j) { j["ns_dtype"] = "int8"; }, "field 'ns_dtype': unknown value 'int8'"},
      {[](nlohmann::json& j) { j["ns_dtype"] = "float16"; },
       "field 'ns_dtype': unknown value 'float16' (expected bfloat16, float32)"},
      {[](nlohmann::json& j) { j["communication_dtype"] = "float64"; },
       "field 'communication_dtype': unknown value 'float64' (expected bfloat16, float32)"},
      {[](nlohmann::json& j) { j["adjust_lr_fn"] = "sqrt"; },
       "field 'adjust_lr_fn': unknown value 'sqrt'"},
      {[](nlohmann::json& j) { j["momentum"] = 1.0; }, "momentum must be in [0, 1)"},
      {[](nlohmann::json& j) { j["ns_epsilon"] = -1e-7; }, "ns_epsilon must be > 0, got -1e-07"},
      {[](nlohmann::json& j) { j["matched_adamw_rms"] = 0; }, "matched_adamw_rms must be > 0"},
      {[](nlohmann::json& j) { j["nesterov"] = 1; }, "field 'nesterov' must be a boolean"},
      {[](nlohmann::json& j) { j.erase("momentum_style"); }, "missing field 'momentum_style'"},
      {[](nlohmann::json& j) { j["lr"] = 0.1; }, "unexpected field 'lr'"},
      {[](nlohmann::json& j) { j["normuon_beta2"] = 1.0; }, "normuon_beta2 must be in [0, 1)"},
      {[](nlohmann::json& j) { j["normuon_epsilon"] = 0.0; }, "normuon_epsilon must be > 0"},
      {[](nlohmann::json& j) { j["cautious_weight_decay"] = "yes"; },
       "field 'cautious_weight_decay' must be a boolean"},
  };
  for (const auto& [edit, expected] : bad) {
    SCOPED_TRACE(expected);
    nlohmann::json changed = values;
    edit(changed);
    try {
      optimizer.set_group_hyperparameters(0, changed);
      ADD_FAILURE() << "expected std::invalid_argument";
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(expected), std::string::npos) << message;
      EXPECT_NE(message.rfind("Muon: ", 0), 0u) << message;  // the caller names leaf and group
    }
    EXPECT_EQ(optimizer.group_hyperparameters(0), values);
  }
}

TEST(MuonTest, SetLrReachesEveryGroupAndParamsWithoutGradAreSkipped) {
  at::Tensor a = at::ones({2, 2});
  at::Tensor b = at::ones({3, 2});
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a});
  groups.emplace_back(std::vector<at::Tensor>{b},
                      std::make_unique<MuonOptions>(MuonOptions().lr(0.5)));
  Muon muon(groups, MuonOptions().lr(0.1));
  EXPECT_EQ(muon.param_groups()[0].options().get_lr(), 0.1);
  EXPECT_EQ(muon.param_groups()[1].options().get_lr(), 0.5);
  muon.set_lr(0.03);
  EXPECT_EQ(muon.param_groups()[0].options().get_lr(), 0.03);
  EXPECT_EQ(muon.param_groups()[1].options().get_lr(), 0.03);

  a.mutable_grad() = at::ones({2, 2});
  muon.step();
  EXPECT_FALSE(at::equal(a, at::ones({2, 2})));
  EXPECT_TRUE(at::equal(b, at::ones({3, 2})));
  EXPECT_TRUE(muon.export_state(b).empty());
  EXPECT_EQ(muon.kind(), "muon");
}

// ---- per-head orthogonalization (muon_per_head, muon_heads.h) ----
// A q-like [3*8, 20] (heads split on dim 0), an o-like [20, 3*8] (dim 1) and a whole 8 x 20
// (the q heads' shape: one Newton-Schulz call with them), one step from zero momentum, so
// u = g + 0.95 g (Nesterov sum) exactly as float32 computes it. The expectation is written
// out per head: newton_schulz of each block alone, the scale of the block's shape (original:
// sqrt(max(1, 20/8)) for o's 20 x 8 heads, 1 for q's 8 x 20), p - lr*scale*O. Float32 on the
// CPU: each head's GEMMs are the same alone or batched, so this is bitwise in practice;
// allowed 1e-6: float32 rounding of O (~1e-7 relative after five steps) times lr*scale <= 0.16.
TEST(MuonPerHeadTest, EachHeadIsNewtonSchulzOfItsBlockWithTheBlockScale) {
  for (const AdjustLrFn fn : {AdjustLrFn::kOriginal, AdjustLrFn::kMatchRmsAdamw}) {
    const MuonOptions options = MuonOptions().lr(0.1).ns_dtype(at::kFloat).adjust_lr_fn(fn);
    at::Tensor q = random_normal({24, 20}, 71), o = random_normal({20, 24}, 72),
               w = random_normal({8, 20}, 73);
    const at::Tensor q0 = q.clone(), o0 = o.clone(), w0 = w.clone();
    Muon muon({q, o, w}, options);
    muon.set_head_split(q, {0, 8});
    muon.set_head_split(o, {1, 8});
    const auto layout = muon.batches(0);
    ASSERT_EQ(layout.size(), 2u);  // 8 x 20: q's heads and w; 20 x 8: o's heads
    EXPECT_EQ(layout[0].rows, 8);
    EXPECT_EQ(layout[0].cols, 20);
    EXPECT_EQ(layout[1].rows, 20);
    EXPECT_EQ(layout[1].cols, 8);

    const at::Tensor gq = random_normal({24, 20}, 81), go = random_normal({20, 24}, 82),
                     gw = random_normal({8, 20}, 83);
    q.mutable_grad() = gq;
    o.mutable_grad() = go;
    w.mutable_grad() = gw;
    muon.step();

    const auto schedule = newton_schulz_schedule("asym5", 5);
    auto ns = [&](const at::Tensor& u) { return newton_schulz(u, schedule, 1e-7, at::kFloat); };
    auto u_of = [](const at::Tensor& g) { return g.add(g, 0.95); };  // buf = g; g + mu*buf
    auto scale = [&](int64_t rows, int64_t cols) {
      return fn == AdjustLrFn::kOriginal ? std::sqrt(std::max(1.0, double(rows) / cols))
                                         : 0.2 * std::sqrt(double(std::max(rows, cols)));
    };
    at::Tensor expected_q = q0.clone(), expected_o = o0.clone();
    for (int64_t h = 0; h < 3; ++h) {
      expected_q.narrow(0, 8 * h, 8).add_(ns(u_of(gq).narrow(0, 8 * h, 8)), -0.1 * scale(8, 20));
      expected_o.narrow(1, 8 * h, 8)
          .add_(ns(u_of(go).narrow(1, 8 * h, 8).contiguous()), -0.1 * scale(20, 8));
    }
    const at::Tensor expected_w = w0 - 0.1 * scale(8, 20) * ns(u_of(gw));
    const std::string what = adjust_lr_fn_name(fn);
    EXPECT_LT(max_abs_diff(q, expected_q), 1e-6) << what;
    EXPECT_LT(max_abs_diff(o, expected_o), 1e-6) << what;
    EXPECT_LT(max_abs_diff(w, expected_w), 1e-6) << what;
    // The whole-matrix update is another one: the split is not a no-op.
    const at::Tensor whole_q = q0 - 0.1 * scale(24, 20) * ns(u_of(gq));
    EXPECT_GT(max_abs_diff(q, whole_q), 1e-3) << what;
  }
}

TEST(MuonPerHeadTest, RejectsSplitsThatDoNotFit) {
  at::Tensor experts = at::zeros({2, 8, 8});
  at::Tensor q = at::zeros({25, 16});
  Muon muon({experts, q}, MuonOptions());
  EXPECT_THROW(muon.set_head_split(experts, {0, 4}), std::invalid_argument);  // 3-D
  EXPECT_THROW(muon.set_head_split(q, {2, 4}), std::invalid_argument);
  EXPECT_THROW(muon.set_head_split(q, {0, 0}), std::invalid_argument);
  muon.set_head_split(q, {0, 8});  // 25 rows: no whole heads of 8; the step refuses
  q.mutable_grad() = at::ones({25, 16});
  try {
    muon.step();
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("model.head_dim"), std::string::npos) << error.what();
  }
  muon.set_head_split(q, {});  // cleared: whole again
  EXPECT_FALSE(muon.head_split(q).active());
  EXPECT_NO_THROW(muon.step());
}

TEST(MuonPerHeadTest, AttentionRolesGetTheirSplit) {
  EXPECT_EQ(attention_head_split(ParamRole::kAttentionQuery, 64)->dim, 0);
  EXPECT_EQ(attention_head_split(ParamRole::kAttentionKey, 64)->dim, 0);
  EXPECT_EQ(attention_head_split(ParamRole::kAttentionValue, 64)->block, 64);
  EXPECT_EQ(attention_head_split(ParamRole::kAttentionOutput, 16)->dim, 1);
  EXPECT_EQ(attention_head_split(ParamRole::kAttentionKeyValue, 23)->block, 23);
  for (const ParamRole role :
       {ParamRole::kEmbedding, ParamRole::kMlp, ParamRole::kRouter, ParamRole::kExpert,
        ParamRole::kNorm, ParamRole::kOutputHead, ParamRole::kAttentionLatent}) {
    EXPECT_FALSE(attention_head_split(role, 16)) << param_role_name(role);
  }
}

// ---- telemetry (muon_telemetry.h) ----
// A 2 x 3 matrix with singular values 1 and 0.5 (rows e1, 0.5 e2): O O^T - I = diag(0, -0.75),
// so e = 0.75 / sqrt(2); a 3 x 2 (tall) with the same rows transposed has the same error
// through the short side; an exactly orthogonal 2 x 2 rotation has 0.
TEST(MuonTelemetryTest, OrthogonalityErrorOfKnownMatrices) {
  const at::Tensor wide = at::tensor({1.0f, 0.0f, 0.0f, 0.0f, 0.5f, 0.0f}).view({2, 3});
  const double c = std::cos(0.3), s = std::sin(0.3);
  const at::Tensor rotation = at::tensor({c, -s, s, c}, at::kDouble).view({2, 2});
  EXPECT_NEAR(orthogonality_error(wide).item<double>(), 0.75 / std::sqrt(2.0), 1e-7);
  EXPECT_NEAR(orthogonality_error(wide.t()).item<double>(), 0.75 / std::sqrt(2.0), 1e-7);
  EXPECT_NEAR(orthogonality_error(rotation).item<double>(), 0.0, 1e-6);  // float32 Gram
  EXPECT_EQ(orthogonality_error(at::stack({wide, wide})).sizes(), at::IntArrayRef({2}));
}

// One step of a Muon with five 6 x 10 matrices (a [3, 6, 10] expert tensor and two 6 x 10),
// telemetry armed: the sample is the first four matrices run (the batch's order: the expert
// tensor's three, then the first matrix), each error as the formula written out here in
// float64 on O = newton_schulz(u); the update terms are lr*scale*O's sums of squares.
// Tolerances: the error through float32 (a Gram of O ~ 1 summed over 6 terms: ~1e-6); the
// sums of squares are float32 sums of 60-180 terms ~ 1: 1e-5 relative.
TEST(MuonTelemetryTest, SampleAndUpdateSquaresAgainstTheFormula) {
  const MuonOptions options = MuonOptions().lr(0.05).ns_dtype(at::kFloat);
  at::Tensor experts = random_normal({3, 6, 10}, 91), a = random_normal({6, 10}, 92),
             b = random_normal({6, 10}, 93);
  Muon muon({experts, a, b}, options);
  const at::Tensor g_experts = random_normal({3, 6, 10}, 94), g_a = random_normal({6, 10}, 95),
                   g_b = random_normal({6, 10}, 96);
  experts.mutable_grad() = g_experts;
  a.mutable_grad() = g_a;
  b.mutable_grad() = g_b;
  muon.arm_telemetry();
  muon.step();
  const auto recorder = muon.take_telemetry();
  ASSERT_TRUE(recorder);
  EXPECT_FALSE(muon.take_telemetry());  // disarmed

  const auto schedule = newton_schulz_schedule("asym5", 5);
  auto o_of = [&](const at::Tensor& g) {
    return newton_schulz(g.add(g, 0.95), schedule, 1e-7, at::kFloat).to(at::kDouble);
  };
  auto error = [](const at::Tensor& o) {  // 6 x 10: O O^T is 6 x 6
    const at::Tensor d = o.mm(o.t()) - at::eye(6, at::kDouble);
    return std::sqrt((d * d).sum().item<double>() / 6.0);
  };
  const at::Tensor o_experts = o_of(g_experts), o_a = o_of(g_a), o_b = o_of(g_b);
  const std::vector<double> expected = {error(o_experts[0]), error(o_experts[1]),
                                        error(o_experts[2]), error(o_a)};
  const at::Tensor errors = at::cat(recorder->errors(0)).to(at::kDouble);
  ASSERT_EQ(errors.numel(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(errors[i].item<double>(), expected[i], 1e-6) << i;

  const double lr_scale = 0.05 * 0.2 * std::sqrt(10.0);
  auto squares = [&](const at::Tensor& o) {
    return lr_scale * lr_scale * (o * o).sum().item<double>();
  };
  for (const auto& [param, o] :
       std::vector<std::pair<at::Tensor, at::Tensor>>{{experts, o_experts}, {a, o_a}, {b, o_b}}) {
    const double got = recorder->update_sum_of_squares(param).item<double>();
    EXPECT_NEAR(got, squares(o), 1e-5 * squares(o));
  }
  // Not armed: nothing recorded.
  experts.mutable_grad() = g_experts;
  muon.step();
  EXPECT_FALSE(muon.take_telemetry());
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
