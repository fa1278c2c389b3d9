// QK-clip (optim/qk_clip.h): the per-head factors written out for MHA and GQA; on a chain of
// q/k projections with biases, every head's causal logits q_h . k_g / sqrt(D) (computed here in
// float64 from the weights) scaled by exactly gamma_h = min(1, tau / S_h); the same bits when the
// rows are split over two "ranks" by placement offsets (FSDP); bfloat16 params with fp32 main
// params: the main param scaled, the model param its rounding; reduce_max_logits on one rank.
#include "mixtrain/optim/qk_clip.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "mixtrain/optim/mixed_precision_optimizer.h"
#include "support/test_sgd.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using test_doubles::make_sgd;

constexpr int64_t kHidden = 12, kHeads = 4, kKvHeads = 2, kHeadDim = 3, kTokens = 7;
const std::string kLayer = "model.layers.0.self_attn.";

void expect_scales(const QkClipScales& got, const std::vector<double>& q,
                   const std::vector<double>& k) {
  ASSERT_EQ(got.q.size(), q.size());
  ASSERT_EQ(got.k.size(), k.size());
  // sqrt and one division in double: 1e-15 relative.
  for (size_t i = 0; i < q.size(); ++i) EXPECT_NEAR(got.q[i], q[i], 1e-15 * q[i]) << "q " << i;
  for (size_t i = 0; i < k.size(); ++i) EXPECT_NEAR(got.k[i], k[i], 1e-15 * k[i]) << "k " << i;
}

TEST(QkClip, MultiHeadScalesBothSidesBySqrtGamma) {
  // tau 100: head 1 (200) gets gamma 1/2, head 2 (exactly tau) is not above it.
  expect_scales(qk_clip_scales({50, 200, 100, 10}, 4, 100.0), {1, std::sqrt(0.5), 1, 1},
                {1, std::sqrt(0.5), 1, 1});
}

TEST(QkClip, GroupedQueryScalesTheSharedKeyBySqrtOfTheGroupMinimum) {
  // Group 0 = heads {0, 1}: gammas {1/4, 1}, m = 1/4: k0 * 1/2, q0 * (1/4)/(1/2), q1 * 1/(1/2).
  // Group 1 = heads {2, 3}: nothing above tau, all 1.
  expect_scales(qk_clip_scales({400, 50, 30, 20}, 2, 100.0), {0.5, 2.0, 1, 1}, {0.5, 1});
  // Both heads clipped: gammas {1/4, 1/2}: k * 1/2, q {1/2, 1}.
  expect_scales(qk_clip_scales({400, 200}, 1, 100.0), {0.5, 1.0}, {0.5});
  EXPECT_THROW(qk_clip_scales({1, 2, 3}, 2, 1.0), std::invalid_argument);
  EXPECT_THROW(qk_clip_scales({1, 2}, 1, 0.0), std::invalid_argument);
}

struct Projections {
  at::Tensor wq, bq, wk, bk;  // float64: [Hq D, H], [Hq D], [Hkv D, H], [Hkv D]
};

Projections random_projections(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  Projections p{at::randn({kHeads * kHeadDim, kHidden}, gen, f64),
                at::randn({kHeads * kHeadDim}, gen, f64),
                at::randn({kKvHeads * kHeadDim, kHidden}, gen, f64),
                at::randn({kKvHeads * kHeadDim}, gen, f64)};
  // Head 0 far above the others, so that a tau between them clips head 0 and leaves its kv
  // partner head 1 unclipped: the GQA case where the shared key shrinks under an unclipped head.
  p.wq.narrow(0, 0, kHeadDim).mul_(30.0);
  p.bq.narrow(0, 0, kHeadDim).mul_(30.0);
  return p;
}

// Head h's logits [T, T] with the future set to -inf: (x Wq^T + bq)_h . (x Wk^T + bk)_{h/n} /
// sqrt(D).
std::vector<at::Tensor> causal_logits(const Projections& p, const at::Tensor& x) {
  const at::Tensor q = at::matmul(x, p.wq.t()) + p.bq, k = at::matmul(x, p.wk.t()) + p.bk;
  const at::Tensor future = at::ones({kTokens, kTokens}, at::kBool).triu(1);
  std::vector<at::Tensor> logits;
  for (int64_t h = 0; h < kHeads; ++h) {
    const int64_t g = h / (kHeads / kKvHeads);
    const at::Tensor qh = q.narrow(1, h * kHeadDim, kHeadDim),
                     kg = k.narrow(1, g * kHeadDim, kHeadDim);
    logits.push_back((at::matmul(qh, kg.t()) / std::sqrt(double(kHeadDim)))
                         .masked_fill(future, -std::numeric_limits<double>::infinity()));
  }
  return logits;
}

NamedTensors named(const Projections& p) {
  return {{kLayer + "q_proj.weight", p.wq},
          {kLayer + "q_proj.bias", p.bq},
          {kLayer + "k_proj.weight", p.wk},
          {kLayer + "k_proj.bias", p.bk}};
}

// What the model declares for the layer's projections (core/param_role.h).
ParamRoles roles() {
  return {{kLayer + "q_proj.weight", {ParamRole::kAttentionQuery, kLayer}},
          {kLayer + "q_proj.bias", {ParamRole::kAttentionQuery, kLayer}},
          {kLayer + "k_proj.weight", {ParamRole::kAttentionKey, kLayer}},
          {kLayer + "k_proj.bias", {ParamRole::kAttentionKey, kLayer}}};
}

std::unique_ptr<ChainedOptimizer> chain_of(const Projections& p) {
  auto chain = std::make_unique<ChainedOptimizer>();
  chain->add_leaf(make_sgd({p.wq, p.bq, p.wk, p.bk}, 0.1), named(p));
  return chain;
}

ModelConfig model_config() {
  ModelConfig c;
  c.num_heads = kHeads;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kHeadDim;
  c.hidden_size = kHidden;
  return c;
}

TEST(QkClip, EveryHeadsLogitsScaleByExactlyItsGammaWeightsAndBiasesAlike) {
  const Projections p = random_projections(7);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
  const at::Tensor x = at::randn({kTokens, kHidden}, gen, at::TensorOptions().dtype(at::kDouble));
  const std::vector<at::Tensor> before = causal_logits(p, x);
  std::vector<double> s_max;
  for (const at::Tensor& l : before) s_max.push_back(l.max().item<double>());
  // tau between head 0 and the rest: only head 0 clipped; its kv partner (head 1) is not.
  const double others = std::max({s_max[1], s_max[2], s_max[3]});
  ASSERT_GT(s_max[0], 4 * others) << "the test needs head 0 far above the others";
  const double tau = 2 * others;

  const at::Tensor wk_before = p.wk.clone(), wq_before = p.wq.clone();
  auto chain = chain_of(p);
  const QkClipStats stats =
      apply_qk_clip(*chain, {{kLayer, s_max}}, {}, model_config(), tau, roles());
  EXPECT_EQ(stats.heads, kHeads);
  EXPECT_EQ(stats.heads_clipped, 1);
  EXPECT_DOUBLE_EQ(stats.max_logit, s_max[0]);

  const std::vector<at::Tensor> after = causal_logits(p, x);
  for (int64_t h = 0; h < kHeads; ++h) {
    SCOPED_TRACE("head " + std::to_string(h));
    const double gamma = s_max[h] > tau ? tau / s_max[h] : 1.0;
    const at::Tensor allowed = at::ones({kTokens, kTokens}, at::kBool).tril();
    // Two float64 products per weight (the factor, the GEMM's terms) and a product of two
    // rounded factors: relative 1e-12 is ~1000x the float64 rounding, far below any wrong factor
    // (the smallest change a mistake could make here is the GQA factor 1 / sqrt(m), >= 1.4).
    const at::Tensor expected = before[h].masked_select(allowed) * gamma;
    const at::Tensor got = after[h].masked_select(allowed);
    EXPECT_TRUE(at::allclose(got, expected, 1e-12, 1e-12))
        << (got - expected).abs().max().item<double>();
    if (gamma < 1) {
      EXPECT_NEAR(after[h].max().item<double>(), tau, 1e-12 * tau);
    }
  }
  // The shared key of group 0 shrank by sqrt(gamma_0); head 1's query grew by its inverse (the
  // GQA choice: not K2's MHA rule, which would leave head 1's logits scaled by sqrt(gamma_0)).
  const double root = std::sqrt(tau / s_max[0]);
  EXPECT_TRUE(
      at::allclose(p.wk.narrow(0, 0, kHeadDim), wk_before.narrow(0, 0, kHeadDim) * root, 1e-15, 0));
  EXPECT_TRUE(at::allclose(p.wq.narrow(0, kHeadDim, kHeadDim),
                           wq_before.narrow(0, kHeadDim, kHeadDim) / root, 1e-15, 0));
  EXPECT_TRUE(
      at::equal(p.wk.narrow(0, kHeadDim, kHeadDim), wk_before.narrow(0, kHeadDim, kHeadDim)));
}

// Multi-head latent attention (K2's MuonClip): per head h the logit is
//   (q_content_h . k_content_h + q_rotary_h . k_rotary) / sqrt(dn + dr),
// q from q_b_proj [H (dn + dr), R] on a query latent, k_content and v from kv_b_proj
// [H (dn + dv), Rkv] on a kv latent, k_rotary one [T, dr] for every head (from
// kv_a_proj_with_mqa, which QK-clip leaves alone). Rotary's rotation is left out: it is linear
// and the same on both sides, so it does not change what the factors do. Every head's logits
// scale by exactly gamma_h; the value rows and the shared rotary key stay as they were.
TEST(QkClip, LatentAttentionScalesContentBySqrtGammaAndTheQueryRotaryByGamma) {
  constexpr int64_t heads = 3, nope = 4, rope = 2, vdim = 5, q_rank = 6, kv_rank = 7;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor q_b = at::randn({heads * (nope + rope), q_rank}, gen, f64);
  at::Tensor kv_b = at::randn({heads * (nope + vdim), kv_rank}, gen, f64);
  q_b.narrow(0, 0, nope + rope).mul_(20.0);  // head 0 far above the others
  const at::Tensor cq = at::randn({kTokens, q_rank}, gen, f64);
  const at::Tensor ckv = at::randn({kTokens, kv_rank}, gen, f64);
  const at::Tensor k_rot = at::randn({kTokens, rope}, gen, f64);
  const auto logits = [&] {
    const at::Tensor q = at::matmul(cq, q_b.t()), kv = at::matmul(ckv, kv_b.t());
    const at::Tensor allowed = at::ones({kTokens, kTokens}, at::kBool).tril();
    std::vector<at::Tensor> out;
    for (int64_t h = 0; h < heads; ++h) {
      const at::Tensor qh = q.narrow(1, h * (nope + rope), nope + rope);
      const at::Tensor kc = kv.narrow(1, h * (nope + vdim), nope);
      const at::Tensor l = (at::matmul(qh.narrow(1, 0, nope), kc.t()) +
                            at::matmul(qh.narrow(1, nope, rope), k_rot.t())) /
                           std::sqrt(double(nope + rope));
      out.push_back(l.masked_select(allowed));
    }
    return out;
  };
  const std::vector<at::Tensor> before = logits();
  std::vector<double> s_max;
  for (const at::Tensor& l : before) s_max.push_back(l.max().item<double>());
  const double tau = 2 * std::max(s_max[1], s_max[2]);
  ASSERT_GT(s_max[0], tau) << "the test needs head 0 clipped";
  const std::string layer = "model.layers.0.self_attn.";
  const NamedTensors named = {{layer + "q_b_proj.weight", q_b}, {layer + "kv_b_proj.weight", kv_b}};
  ParamRoles roles;
  roles[layer + "q_b_proj.weight"] = {ParamRole::kAttentionQuery, layer, {nope + rope, nope, rope}};
  roles[layer + "kv_b_proj.weight"] = {
      ParamRole::kAttentionKeyValue, layer, {nope + vdim, nope, 0}};
  ChainedOptimizer chain;
  chain.add_leaf(make_sgd({q_b, kv_b}, 0.1), named);
  const at::Tensor kv_before = kv_b.clone(), q_before = q_b.clone();
  ModelConfig model;
  model.num_heads = heads;
  model.num_kv_heads = heads;
  model.head_dim = rope;  // deepseek_v3's head_dim: never the block here
  const QkClipStats stats = apply_qk_clip(chain, {{layer, s_max}}, {}, model, tau, roles);
  EXPECT_EQ(stats.heads_clipped, 1);
  const std::vector<at::Tensor> after = logits();
  const double gamma = tau / s_max[0];
  for (int64_t h = 0; h < heads; ++h) {
    // As in the test above: 1e-12 relative is ~1000x float64 rounding.
    const double g = h == 0 ? gamma : 1.0;
    EXPECT_TRUE(at::allclose(after[h], before[h] * g, 1e-12, 1e-12)) << "head " << h;
  }
  EXPECT_NEAR(after[0].max().item<double>(), tau, 1e-12 * tau);
  // Head 0's parts: content rows by sqrt(gamma), rotary rows by gamma, value rows untouched.
  const double root = std::sqrt(gamma);
  EXPECT_TRUE(at::allclose(q_b.narrow(0, 0, nope), q_before.narrow(0, 0, nope) * root, 1e-15, 0));
  EXPECT_TRUE(
      at::allclose(q_b.narrow(0, nope, rope), q_before.narrow(0, nope, rope) * gamma, 1e-15, 0));
  EXPECT_TRUE(at::allclose(kv_b.narrow(0, 0, nope), kv_before.narrow(0, 0, nope) * root, 1e-15, 0));
  EXPECT_TRUE(at::equal(kv_b.narrow(0, nope, vdim), kv_before.narrow(0, nope, vdim)));
  EXPECT_TRUE(at::equal(q_b.narrow(0, nope + rope, 2 * (nope + rope)),
                        q_before.narrow(0, nope + rope, 2 * (nope + rope))));
}

TEST(QkClip, RowsSplitOverRanksByPlacementGiveTheWholeResult) {
  const std::vector<double> s_max = {400, 50, 30, 250};
  const Projections whole = random_projections(11);
  apply_qk_clip(*chain_of(whole), {{kLayer, s_max}}, {}, model_config(), 100.0, roles());
  // Dim 0 split over two ranks: rank 0 rows [0, c), rank 1 the rest, with c = rows / 2 + 1 not a
  // multiple of head_dim, so a head straddles the two pieces (FSDP's chunks can).
  const Projections original = random_projections(11);
  at::Tensor pieces[4][2];
  const at::Tensor params[4] = {original.wq, original.bq, original.wk, original.bk};
  for (int rank = 0; rank < 2; ++rank) {
    Projections local;
    std::vector<ParamPlacement> placements;
    at::Tensor* slots[4] = {&local.wq, &local.bq, &local.wk, &local.bk};
    const NamedTensors names = named(original);
    for (int i = 0; i < 4; ++i) {
      const int64_t rows = params[i].size(0), chunk = rows / 2 + 1;
      const int64_t offset = rank * chunk, count = rank == 0 ? chunk : rows - chunk;
      *slots[i] = params[i].narrow(0, offset, count).clone();
      pieces[i][rank] = *slots[i];
      ParamPlacement placement;
      placement.name = names[i].first;
      placement.kind = ParamPlacement::Kind::kDim0Shard;
      placement.global_shape = params[i].sizes().vec();
      placement.offset = offset;
      placement.rows = count;
      placements.push_back(placement);
    }
    apply_qk_clip(*chain_of(local), {{kLayer, s_max}}, placements, model_config(), 100.0, roles());
  }
  const at::Tensor expected[4] = {whole.wq, whole.bq, whole.wk, whole.bk};
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(at::equal(at::cat({pieces[i][0], pieces[i][1]}), expected[i])) << i;
  }
  EXPECT_FALSE(at::equal(expected[0], original.wq));  // something was clipped
}

TEST(QkClip, MainParamsScaledAndLowPrecisionModelParamsTheirRounding) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  NamedTensors model;
  for (const auto& [name, rows] : std::vector<std::pair<std::string, int64_t>>{
           {"q_proj.weight", kHeads * kHeadDim}, {"k_proj.weight", kKvHeads * kHeadDim}}) {
    model.emplace_back(kLayer + name,
                       at::randn({rows, kHidden}, gen).to(at::kBFloat16).requires_grad_(true));
  }
  auto chain = std::make_unique<ChainedOptimizer>();
  chain->add_leaf(make_sgd({model[0].second, model[1].second}, 0.1), model);
  MixedPrecisionOptimizer opt(std::move(chain));
  // A float32 main param that differs from its bfloat16 model param (as after a step), so a
  // model param rescaled on its own would not equal the rounding of the scaled main param.
  for (const auto& [name, param] : model) {
    at::NoGradGuard no_grad;
    opt.main_param(name).add_(at::full_like(opt.main_param(name), 1e-4));
  }
  const at::Tensor q_main = opt.main_param(model[0].first).clone();
  const QkClipStats stats = apply_qk_clip(opt.chained(), {{kLayer, {400, 50, 30, 20}}}, {},
                                          model_config(), 100.0, roles());
  EXPECT_EQ(stats.heads_clipped, 1);
  // Head 0: gamma 1/4, m = 1/4: q rows times 1/2 (exact in binary), head 1's times 2.
  EXPECT_TRUE(at::equal(opt.main_param(model[0].first).narrow(0, 0, kHeadDim),
                        q_main.narrow(0, 0, kHeadDim) * 0.5));
  EXPECT_TRUE(at::equal(opt.main_param(model[0].first).narrow(0, kHeadDim, kHeadDim),
                        q_main.narrow(0, kHeadDim, kHeadDim) * 2.0));
  for (const auto& [name, param] : model) {
    EXPECT_TRUE(at::equal(param, opt.main_param(name).to(at::kBFloat16))) << name;
  }
}

TEST(QkClip, ReduceMaxLogitsOnOneRankKeepsTheValues) {
  const auto local = make_local_collectives("world");
  const auto reduced = reduce_max_logits(
      *local, {{"b.", at::tensor({1.5f, -2.0f})}, {"a.", at::tensor({3.0f, 0.25f})}});
  ASSERT_EQ(reduced.size(), 2u);
  EXPECT_EQ(reduced.at("a."), (std::vector<double>{3.0, 0.25}));
  EXPECT_EQ(reduced.at("b."), (std::vector<double>{1.5, -2.0}));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
