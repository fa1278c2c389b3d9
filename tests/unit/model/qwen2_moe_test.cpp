// The MoE decoders. Tiny Qwen2-MoE: parameter names/shapes (HF), init, forward/backward,
// causality, determinism, rotary helpers, the load-balancing loss against hand computation, and a
// float64 dense reference forward written independently here (per-head loops, pair-wise rotation,
// dense experts). Qwen3-MoE: names/shapes/roles, and for both: the router against HF's TopKRouter,
// and logits, loss (with aux loss) and every gradient against transformers (support/hf_parity.h).
#include "mixtrain/model/qwen2_moe.h"
#include "mixtrain/model/moe_config.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <torch/nn/functional.h>
#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "support/hf_parity.h"
#include "support/python_script.h"
#include "support/tiny_model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/safetensors.h"
#include "mixtrain/model/init_dtype.h"
#include "mixtrain/model/registry.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

// Every size distinct, and num_heads * head_dim != hidden_size, so a transposed or mixed-up
// dimension cannot go unnoticed.
using test_support::tiny_config;

torch::Tensor random_ids(const ModelConfig& c, int64_t batch, int64_t seq, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(c.vocab_size, {batch, seq}, gen, torch::kInt64);
}

std::map<std::string, torch::Tensor> params_of(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (auto& item : m.named_parameters()) out[item.key()] = item.value();
  return out;
}

TEST(Qwen2Moe, ParameterNamesAndShapesMatchHuggingFace) {
  const auto c = tiny_config();
  const int64_t V = c.vocab_size, H = c.hidden_size, D = c.head_dim, E = moe_config(c).num_experts;
  const int64_t I = moe_config(c).moe_intermediate_size,
                S = moe_config(c).shared_expert_intermediate_size;
  const int64_t Q = c.num_heads * D, KV = c.num_kv_heads * D;
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"model.embed_tokens.weight", {V, H}}};
  for (int n = 0; n < 2; ++n) {
    const std::string p = "model.layers." + std::to_string(n) + ".";
    const std::vector<std::pair<std::string, std::vector<int64_t>>> layer = {
        {"self_attn.q_proj.weight", {Q, H}},
        {"self_attn.q_proj.bias", {Q}},
        {"self_attn.k_proj.weight", {KV, H}},
        {"self_attn.k_proj.bias", {KV}},
        {"self_attn.v_proj.weight", {KV, H}},
        {"self_attn.v_proj.bias", {KV}},
        {"self_attn.o_proj.weight", {H, Q}},
        {"mlp.gate.weight", {E, H}},
        {"mlp.experts.gate_proj", {E, I, H}},
        {"mlp.experts.up_proj", {E, I, H}},
        {"mlp.experts.down_proj", {E, H, I}},
        {"mlp.shared_expert.gate_proj.weight", {S, H}},
        {"mlp.shared_expert.up_proj.weight", {S, H}},
        {"mlp.shared_expert.down_proj.weight", {H, S}},
        {"mlp.shared_expert_gate.weight", {1, H}},
        {"input_layernorm.weight", {H}},
        {"post_attention_layernorm.weight", {H}},
    };
    for (const auto& [name, shape] : layer) expected.push_back({p + name, shape});
  }
  expected.push_back({"model.norm.weight", {H}});
  expected.push_back({"lm_head.weight", {V, H}});

  auto model = qwen2_moe::make_qwen2_moe(c, 1);
  const auto named = model->named_parameters();
  ASSERT_EQ(named.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(named[i].key(), expected[i].first) << "position " << i;  // HF state_dict order
    EXPECT_EQ(named[i].value().sizes().vec(), expected[i].second) << expected[i].first;
    EXPECT_EQ(named[i].value().scalar_type(), torch::kFloat32) << expected[i].first;
    EXPECT_TRUE(named[i].value().requires_grad()) << expected[i].first;
  }
  // Rotary tables are computed, not stored: nothing besides parameters to checkpoint or convert.
  EXPECT_EQ(model->named_buffers().size(), 0u);
}

TEST(Qwen2Moe, InitIsHuggingFaceStyle) {
  auto model = qwen2_moe::make_qwen2_moe(tiny_config(), 3);
  std::vector<torch::Tensor> normal;
  for (auto& item : model->named_parameters()) {
    const auto& name = item.key();
    const auto& p = item.value();
    if (name.find(".bias") != std::string::npos) {
      EXPECT_TRUE(torch::equal(p, torch::zeros_like(p))) << name;
    } else if (name.find("norm.weight") != std::string::npos) {
      EXPECT_TRUE(torch::equal(p, torch::ones_like(p))) << name;
    } else {
      normal.push_back(p.detach().flatten());
    }
  }
  const auto all = torch::cat(normal);
  ASSERT_GT(all.numel(), 10000);
  // normal(0, 0.02) over n > 10^4 samples: the standard error of the mean is 0.02/sqrt(n) <
  // 2e-4 and of the std about 0.02/sqrt(2n) < 1.5e-4; bounds are > 5 standard errors.
  EXPECT_NEAR(all.mean().item<double>(), 0.0, 1e-3);
  EXPECT_NEAR(all.std().item<double>(), 0.02, 1e-3);
}

TEST(Qwen2Moe, SameSeedSameModelDifferentSeedDifferentModel) {
  const auto c = tiny_config();
  auto a = qwen2_moe::make_qwen2_moe(c, 42);
  auto b = qwen2_moe::make_qwen2_moe(c, 42);
  auto d = qwen2_moe::make_qwen2_moe(c, 43);
  auto pa = params_of(*a), pb = params_of(*b), pd = params_of(*d);
  for (auto& [name, p] : pa) {
    EXPECT_TRUE(torch::equal(p, pb[name])) << name;  // bit-identical
    const bool constant_init =
        name.find("norm.weight") != std::string::npos || name.find(".bias") != std::string::npos;
    if (!constant_init) {
      EXPECT_FALSE(torch::equal(p, pd[name])) << name;
    }
  }
  const auto ids = random_ids(c, 2, 9, 5);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(a->forward(ids).logits, b->forward(ids).logits));
  EXPECT_TRUE(torch::equal(a->forward(ids).aux_loss, b->forward(ids).aux_loss));
  EXPECT_FALSE(torch::equal(a->forward(ids).logits, d->forward(ids).logits));
}

TEST(Qwen2Moe, InitLeavesTheGlobalGeneratorAlone) {
  torch::manual_seed(7);
  const auto expected = torch::rand({8});
  torch::manual_seed(7);
  qwen2_moe::make_qwen2_moe(tiny_config(), 11);
  EXPECT_TRUE(torch::equal(torch::rand({8}), expected));
}

TEST(Qwen2Moe, OutputShapesAndDtypes) {
  const auto c = tiny_config();
  auto model = qwen2_moe::make_qwen2_moe(c, 1);
  const auto out = model->forward(random_ids(c, 3, 7, 2));
  EXPECT_EQ(out.logits.sizes().vec(), (std::vector<int64_t>{3, 7, c.vocab_size}));
  EXPECT_EQ(out.logits.scalar_type(), torch::kFloat32);
  EXPECT_EQ(out.aux_loss.dim(), 0);
  EXPECT_EQ(out.aux_loss.scalar_type(), torch::kFloat32);
  EXPECT_EQ(model->config().vocab_size, c.vocab_size);
}

TEST(Qwen2Moe, RejectsBadInput) {
  const auto c = tiny_config();
  auto model = qwen2_moe::make_qwen2_moe(c, 1);
  EXPECT_THROW(model->forward(random_ids(c, 1, 5, 1).to(torch::kInt32)), c10::Error);
  EXPECT_THROW(model->forward(random_ids(c, 1, c.max_seq_len + 1, 1)), c10::Error);
}

TEST(Qwen2Moe, ForwardBackwardReachesEveryParameter) {
  const auto c = tiny_config();
  auto model = qwen2_moe::make_qwen2_moe(c, 9);
  // 2 x 12 = 24 tokens, 2 slots each, over 4 experts with a near-uniform fresh router: an expert
  // left without tokens in a layer has probability ~4 * 2^-24, so every expert slice must get a
  // gradient (the result is deterministic for this seed anyway).
  const auto ids = random_ids(c, 2, 13, 4);
  const auto inputs = ids.narrow(1, 0, 12), labels = ids.narrow(1, 1, 12);
  const auto out = model->forward(inputs);
  const auto ce = torch::nn::functional::cross_entropy(out.logits.reshape({-1, c.vocab_size}),
                                                       labels.reshape({-1}));
  const auto loss = ce + moe_config(c).router_aux_loss_coef * out.aux_loss;
  ASSERT_TRUE(std::isfinite(loss.item<double>()));
  // A fresh model predicts nearly uniformly: CE close to ln(vocab).
  EXPECT_NEAR(ce.item<double>(), std::log(double(c.vocab_size)), 0.1);
  loss.backward();
  for (auto& item : model->named_parameters()) {
    const auto& g = item.value().grad();
    ASSERT_TRUE(g.defined()) << item.key();
    EXPECT_TRUE(torch::isfinite(g).all().item<bool>()) << item.key();
    EXPECT_GT(g.abs().sum().item<double>(), 0.0) << item.key();
    if (item.key().find("mlp.experts.") != std::string::npos) {
      for (int64_t e = 0; e < moe_config(c).num_experts; ++e) {
        EXPECT_GT(g[e].abs().sum().item<double>(), 0.0) << item.key() << " expert " << e;
      }
    }
  }
}

TEST(Qwen2Moe, AuxLossGradientReachesTheRouter) {
  const auto c = tiny_config();
  auto model = qwen2_moe::make_qwen2_moe(c, 9);
  model->forward(random_ids(c, 2, 8, 4)).aux_loss.backward();
  for (auto& item : model->named_parameters()) {
    if (item.key().find("mlp.gate.weight") == std::string::npos) continue;
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_GT(item.value().grad().abs().sum().item<double>(), 0.0) << item.key();
  }
}

TEST(Qwen2Moe, LaterTokensDoNotChangeEarlierLogits) {
  const auto c = tiny_config();
  auto model = qwen2_moe::make_qwen2_moe(c, 2);
  torch::NoGradGuard no_grad;
  const auto ids = random_ids(c, 2, 10, 8);
  auto changed = ids.clone();
  changed.index_put_({torch::indexing::Slice(), 6}, (ids.select(1, 6) + 1) % c.vocab_size);
  const auto a = model->forward(ids).logits, b = model->forward(changed).logits;
  // Not bit-equal: the expert GEMMs see a different set of rows, and the kernel may block them
  // differently; 1e-6 is ~100 float32 ulps of these O(0.1) logits.
  EXPECT_TRUE(torch::allclose(a.narrow(1, 0, 6), b.narrow(1, 0, 6), 0.0, 1e-6));
  EXPECT_GT((a.narrow(1, 6, 4) - b.narrow(1, 6, 4)).abs().max().item<double>(), 1e-4);
}

// --- the helpers ------------------------------------------------------------------------------

TEST(Qwen2MoeRotary, TablesMatchTheFormula) {
  const auto [cos, sin] = qwen2_moe::rotary_cos_sin(5, 4, 10000.0);
  ASSERT_EQ(cos.sizes().vec(), (std::vector<int64_t>{5, 4}));
  // head_dim 4: inv_freq = {10000^0, 10000^-0.5} = {1, 0.01}; both halves repeat.
  for (int64_t pos = 0; pos < 5; ++pos) {
    for (int64_t i = 0; i < 4; ++i) {
      const double angle = pos * (i % 2 == 0 ? 1.0 : 0.01);
      EXPECT_NEAR(cos[pos][i].item<double>(), std::cos(angle), 1e-6);  // float32 sin/cos
      EXPECT_NEAR(sin[pos][i].item<double>(), std::sin(angle), 1e-6);
    }
  }
}

TEST(Qwen2MoeRotary, PositionZeroIsIdentityAndRotationsPreserveNormsAndRelativeDots) {
  const auto [cos, sin] = qwen2_moe::rotary_cos_sin(8, 8, 10000.0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto q = torch::randn({8}, gen), k = torch::randn({8}, gen);
  const auto qs = q.expand({1, 1, 8, 8}).contiguous(), ks = k.expand({1, 1, 8, 8}).contiguous();
  const auto rq = qwen2_moe::apply_rotary_pos_emb(qs, cos, sin)[0][0];
  const auto rk = qwen2_moe::apply_rotary_pos_emb(ks, cos, sin)[0][0];
  EXPECT_TRUE(torch::equal(rq[0], q));  // cos = 1, sin = 0 exactly at position 0
  for (int64_t pos = 0; pos < 8; ++pos) {
    EXPECT_NEAR(rq[pos].norm().item<double>(), q.norm().item<double>(), 1e-5);
  }
  // <R_m q, R_n k> depends on m - n only; float32 rounding of O(1) products: 1e-5.
  const double d31 = rq[3].dot(rk[1]).item<double>(), d64 = rq[6].dot(rk[4]).item<double>();
  const double d20 = rq[2].dot(rk[0]).item<double>();
  EXPECT_NEAR(d31, d64, 1e-5);
  EXPECT_NEAR(d31, d20, 1e-5);
}

// Hand version of HF load_balancing_loss_func: plain loops in double over rows of logits.
double hand_aux_loss(const std::vector<std::vector<double>>& rows, int num_experts, int top_k) {
  std::vector<double> routed(num_experts, 0.0), prob(num_experts, 0.0);
  for (const auto& row : rows) {
    double z = 0;
    for (double v : row) z += std::exp(v);
    std::vector<int> order(num_experts);
    for (int e = 0; e < num_experts; ++e) {
      order[e] = e;
      prob[e] += std::exp(row[e]) / z;
    }
    std::sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
    for (int j = 0; j < top_k; ++j) routed[order[j]] += 1.0;
  }
  double sum = 0;
  for (int e = 0; e < num_experts; ++e) sum += (routed[e] / rows.size()) * (prob[e] / rows.size());
  return num_experts * sum;
}

torch::Tensor to_tensor(const std::vector<std::vector<double>>& rows) {
  std::vector<torch::Tensor> t;
  for (const auto& r : rows) t.push_back(torch::tensor(r, torch::kFloat32));
  return torch::stack(t);
}

TEST(Qwen2MoeAuxLoss, MatchesHandComputationAcrossLayers) {
  // Two layers x two tokens x three experts, no ties inside any top-2.
  const std::vector<std::vector<double>> layer0 = {{1.0, 2.0, 0.5}, {0.1, -1.0, 3.0}};
  const std::vector<std::vector<double>> layer1 = {{2.0, 2.5, -1.0}, {0.3, 0.0, 1.0}};
  std::vector<std::vector<double>> all = layer0;
  all.insert(all.end(), layer1.begin(), layer1.end());
  for (int top_k : {1, 2}) {
    const double expected = hand_aux_loss(all, 3, top_k);
    const auto got =
        qwen2_moe::load_balancing_loss({to_tensor(layer0), to_tensor(layer1)}, 3, top_k);
    EXPECT_EQ(got.scalar_type(), torch::kFloat32);
    // float32 softmax and means over 4 rows: a few ulps of an O(1) value.
    EXPECT_NEAR(got.item<double>(), expected, 1e-6) << "top_k " << top_k;
  }
  // Worked by hand for top_k = 1: token argmaxes are experts 1, 2, 1, 2, so f = (0, 1/2, 1/2)
  // and loss = 3 * (P_1 + P_2) / 2 = 3 * (1 - P_0) / 2 with P_0 the mean softmax of expert 0.
  double p0 = 0;
  for (const auto& r : all)
    p0 += std::exp(r[0]) / (std::exp(r[0]) + std::exp(r[1]) + std::exp(r[2]));
  p0 /= 4;
  EXPECT_NEAR(hand_aux_loss(all, 3, 1), 1.5 * (1 - p0), 1e-12);
}

TEST(Qwen2MoeAuxLoss, ClosedFormsAndBf16Input) {
  // Uniform router: P_e = 1/E and sum_e f_e = top_k whatever the tie-breaking: loss = top_k.
  EXPECT_NEAR(qwen2_moe::load_balancing_loss({torch::zeros({6, 4})}, 4, 2).item<double>(), 2.0,
              1e-6);
  // Every token certain of expert 0 (exp(-50) ~ 2e-22 is below float32 resolution): loss = E.
  auto skewed = torch::zeros({5, 3});
  skewed.select(1, 0).fill_(50.0);
  EXPECT_NEAR(qwen2_moe::load_balancing_loss({skewed}, 3, 1).item<double>(), 3.0, 1e-6);
  // bf16 router logits are upcast first: the result is float32 and equals the float32 result
  // for the same (bf16-representable) values.
  const auto logits = to_tensor({{1.0, 2.0, 0.5}, {0.125, -1.0, 3.0}});
  const auto from_bf16 = qwen2_moe::load_balancing_loss({logits.to(torch::kBFloat16)}, 3, 2);
  EXPECT_EQ(from_bf16.scalar_type(), torch::kFloat32);
  EXPECT_EQ(from_bf16.item<float>(), qwen2_moe::load_balancing_loss({logits}, 3, 2).item<float>());
  EXPECT_EQ(qwen2_moe::load_balancing_loss({}, 3, 2).item<float>(), 0.0f);
}

// --- an independent float64 reference of the whole forward -----------------------------------

using Params = std::map<std::string, torch::Tensor>;

torch::Tensor ref_rms(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return x / torch::sqrt(x.pow(2).mean(-1, true) + eps) * w;
}

// Rotates each pair (x_i, x_{i+D/2}) by pos * theta^(-2i/D).
torch::Tensor ref_rope(const torch::Tensor& x, int64_t pos, double theta) {
  const int64_t D = x.size(-1), half = D / 2;
  auto out = x.clone();
  for (int64_t i = 0; i < half; ++i) {
    const double angle = pos * std::pow(theta, -2.0 * i / D);
    const auto a = x.select(-1, i), b = x.select(-1, i + half);
    out.select(-1, i).copy_(a * std::cos(angle) - b * std::sin(angle));
    out.select(-1, i + half).copy_(b * std::cos(angle) + a * std::sin(angle));
  }
  return out;
}

torch::Tensor ref_swiglu(const torch::Tensor& x, const torch::Tensor& g, const torch::Tensor& u,
                         const torch::Tensor& d) {
  const auto gx = x.matmul(g.t());
  return (gx * torch::sigmoid(gx) * x.matmul(u.t())).matmul(d.t());
}

// x [S, H] for one sequence -> ([S, H], router logits [S, E]).
std::pair<torch::Tensor, torch::Tensor> ref_layer(const ModelConfig& c, Params& P,
                                                  const std::string& p, const torch::Tensor& x) {
  const int64_t S = x.size(0), D = c.head_dim, groups = c.num_heads / c.num_kv_heads;
  const auto h = ref_rms(x, P[p + "input_layernorm.weight"], c.rms_norm_eps);
  const auto q = h.matmul(P[p + "self_attn.q_proj.weight"].t()) + P[p + "self_attn.q_proj.bias"];
  const auto k = h.matmul(P[p + "self_attn.k_proj.weight"].t()) + P[p + "self_attn.k_proj.bias"];
  const auto v = h.matmul(P[p + "self_attn.v_proj.weight"].t()) + P[p + "self_attn.v_proj.bias"];
  std::vector<torch::Tensor> heads;
  for (int64_t head = 0; head < c.num_heads; ++head) {
    const int64_t kv = head / groups;
    auto out = torch::zeros({S, D}, torch::kFloat64);
    for (int64_t i = 0; i < S; ++i) {
      const auto qi = ref_rope(q[i].narrow(0, head * D, D), i, c.rope_theta);
      std::vector<double> scores;
      for (int64_t j = 0; j <= i; ++j) {  // causal: keys up to the query's position
        const auto kj = ref_rope(k[j].narrow(0, kv * D, D), j, c.rope_theta);
        scores.push_back(qi.dot(kj).item<double>() / std::sqrt(double(D)));
      }
      const double m = *std::max_element(scores.begin(), scores.end());
      double z = 0;
      for (double& s : scores) z += (s = std::exp(s - m));
      for (int64_t j = 0; j <= i; ++j) out[i] += scores[j] / z * v[j].narrow(0, kv * D, D);
    }
    heads.push_back(out);
  }
  const auto attn = torch::cat(heads, 1).matmul(P[p + "self_attn.o_proj.weight"].t());
  const auto x2 = x + attn;
  const auto h2 = ref_rms(x2, P[p + "post_attention_layernorm.weight"], c.rms_norm_eps);
  const auto router_logits = h2.matmul(P[p + "mlp.gate.weight"].t());
  const auto probs = torch::softmax(router_logits, -1);
  // Dense: every expert on every token, weighted by its probability if it is in the top-k.
  auto moe = torch::zeros_like(h2);
  for (int64_t t = 0; t < S; ++t) {
    std::vector<int64_t> order(moe_config(c).num_experts);
    for (int64_t e = 0; e < moe_config(c).num_experts; ++e) order[e] = e;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return probs[t][a].item<double>() > probs[t][b].item<double>();
    });
    for (int64_t j = 0; j < moe_config(c).num_experts_per_tok; ++j) {
      const int64_t e = order[j];
      const auto y = ref_swiglu(h2[t].unsqueeze(0), P[p + "mlp.experts.gate_proj"][e],
                                P[p + "mlp.experts.up_proj"][e], P[p + "mlp.experts.down_proj"][e]);
      moe[t] += probs[t][e] * y[0];
    }
  }
  const auto shared = ref_swiglu(h2, P[p + "mlp.shared_expert.gate_proj.weight"],
                                 P[p + "mlp.shared_expert.up_proj.weight"],
                                 P[p + "mlp.shared_expert.down_proj.weight"]);
  const auto shared_gate = torch::sigmoid(h2.matmul(P[p + "mlp.shared_expert_gate.weight"].t()));
  return {x2 + moe + shared_gate * shared, router_logits};
}

TEST(Qwen2Moe, MatchesAnIndependentFloat64Reference) {
  const auto c = tiny_config();
  auto model = qwen2_moe::make_qwen2_moe(c, 21);
  Params P;
  for (auto& [name, t] : params_of(*model)) P[name] = t.detach().to(torch::kFloat64);
  const auto ids = random_ids(c, 2, 6, 13);
  torch::NoGradGuard no_grad;
  const auto out = model->forward(ids);

  std::vector<torch::Tensor> logits;
  std::vector<std::vector<double>> router_rows;
  std::vector<std::vector<torch::Tensor>> router_per_layer(c.num_layers);
  for (int64_t b = 0; b < ids.size(0); ++b) {
    auto x = P["model.embed_tokens.weight"].index_select(0, ids[b]);
    for (int64_t n = 0; n < c.num_layers; ++n) {
      auto [y, r] = ref_layer(c, P, "model.layers." + std::to_string(n) + ".", x);
      x = y;
      router_per_layer[n].push_back(r);
    }
    logits.push_back(
        ref_rms(x, P["model.norm.weight"], c.rms_norm_eps).matmul(P["lm_head.weight"].t()));
  }
  const auto expected = torch::stack(logits);
  // float32 vs float64 through two layers of O(1) activations: a few float32 ulps (~1e-7
  // relative) per op; the logits are O(0.4) and differ by ~4e-8 here, so 1e-6 absolute leaves a
  // 20x margin while any wrong formula (rope, GQA mapping, routing) is off by > 1e-3.
  const double max_err = (out.logits.to(torch::kFloat64) - expected).abs().max().item<double>();
  RecordProperty("max_abs_err", ::testing::PrintToString(max_err));
  RecordProperty("logit_scale", ::testing::PrintToString(expected.abs().max().item<double>()));
  EXPECT_LT(max_err, 1e-6);
  EXPECT_GT(expected.abs().max().item<double>(), 1e-2);  // the comparison is not vacuous

  // Aux loss: layers concatenated in order, each layer's rows in (batch, seq) order.
  for (int64_t n = 0; n < c.num_layers; ++n) {
    const auto rows = torch::cat(router_per_layer[n]);
    for (int64_t t = 0; t < rows.size(0); ++t) {
      router_rows.push_back(std::vector<double>(
          rows[t].data_ptr<double>(), rows[t].data_ptr<double>() + moe_config(c).num_experts));
    }
  }
  EXPECT_NEAR(
      out.aux_loss.item<double>(),
      hand_aux_loss(router_rows, moe_config(c).num_experts, moe_config(c).num_experts_per_tok),
      1e-6);  // O(2) value, float32 means: ~1e-7
}

// --- low precision ----------------------------------------------------------------------------

TEST(Qwen2Moe, Bfloat16ForwardAndBackward) {
  const auto c = tiny_config();
  auto ref = qwen2_moe::make_qwen2_moe(c, 17);
  auto model = qwen2_moe::make_qwen2_moe(c, 17);
  apply_model_init_dtype(*model, torch::kBFloat16);
  const auto ids = random_ids(c, 2, 8, 1);
  const auto out = model->forward(ids);
  EXPECT_EQ(out.logits.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(out.aux_loss.scalar_type(), torch::kFloat32);
  ASSERT_TRUE(torch::isfinite(out.logits).all().item<bool>());
  torch::Tensor expected;
  {
    torch::NoGradGuard no_grad;
    expected = ref->forward(ids).logits;
  }
  // bf16 keeps 8 significant bits (relative step 2^-8 = 0.004); weights, activations and
  // every GEMM output are rounded, a few dozen roundings along the path (measured: 0.5% of the
  // logit scale): allow 5%. A wrong kernel or dtype mix-up is off by O(100%).
  const double scale = expected.abs().max().item<double>();
  const double err = (out.logits.to(torch::kFloat32) - expected).abs().max().item<double>();
  RecordProperty("relative_err", ::testing::PrintToString(err / scale));
  EXPECT_LT(err, 0.05 * scale);
  const auto loss = torch::nn::functional::cross_entropy(
      out.logits.to(torch::kFloat32).reshape({-1, c.vocab_size}), ids.roll(-1, 1).reshape({-1}));
  (loss + moe_config(c).router_aux_loss_coef * out.aux_loss).backward();
  for (auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_EQ(item.value().grad().scalar_type(), torch::kBFloat16) << item.key();
    EXPECT_TRUE(torch::isfinite(item.value().grad()).all().item<bool>()) << item.key();
  }
}

TEST(Qwen2Moe, Float16ModelCanBeBuiltAndConverted) {
  // Conversion only; tools/train_command_test trains a float16 model computing in float16.
  auto model = qwen2_moe::make_qwen2_moe(tiny_config(), 1);
  apply_model_init_dtype(*model, torch::kFloat16);
  for (auto& item : model->named_parameters()) {
    EXPECT_EQ(item.value().scalar_type(), torch::kFloat16) << item.key();
  }
}

ModelConfig tiny_qwen3_moe(bool attention_bias, bool norm_topk_prob) {
  auto c = tiny_config();
  c.name = "qwen3_moe";
  c.attention_bias = attention_bias;
  moe_config(c).norm_topk_prob = norm_topk_prob;
  return c;
}

TEST(Qwen3Moe, ParameterNamesShapesAndRolesMatchHuggingFace) {
  const auto c = tiny_qwen3_moe(/*attention_bias=*/true, /*norm_topk_prob=*/true);
  const int64_t V = c.vocab_size, H = c.hidden_size, D = c.head_dim, E = moe_config(c).num_experts;
  const int64_t I = moe_config(c).moe_intermediate_size, Q = c.num_heads * D,
                KV = c.num_kv_heads * D;
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"model.embed_tokens.weight", {V, H}}};
  for (int n = 0; n < 2; ++n) {
    const std::string p = "model.layers." + std::to_string(n) + ".";
    const std::vector<std::pair<std::string, std::vector<int64_t>>> layer = {
        {"self_attn.q_proj.weight", {Q, H}},  {"self_attn.q_proj.bias", {Q}},
        {"self_attn.k_proj.weight", {KV, H}}, {"self_attn.k_proj.bias", {KV}},
        {"self_attn.v_proj.weight", {KV, H}}, {"self_attn.v_proj.bias", {KV}},
        {"self_attn.o_proj.weight", {H, Q}},  {"self_attn.o_proj.bias", {H}},
        {"self_attn.q_norm.weight", {D}},     {"self_attn.k_norm.weight", {D}},
        {"mlp.gate.weight", {E, H}},          {"mlp.experts.gate_proj", {E, I, H}},
        {"mlp.experts.up_proj", {E, I, H}},   {"mlp.experts.down_proj", {E, H, I}},
        {"input_layernorm.weight", {H}},      {"post_attention_layernorm.weight", {H}}};
    for (const auto& [name, shape] : layer) expected.push_back({p + name, shape});
  }
  expected.push_back({"model.norm.weight", {H}});
  expected.push_back({"lm_head.weight", {V, H}});
  const auto model = build_model(c, 1);
  const auto named = model->named_parameters();
  ASSERT_EQ(named.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(named[i].key(), expected[i].first) << "position " << i;
    EXPECT_EQ(named[i].value().sizes().vec(), expected[i].second) << expected[i].first;
  }
  EXPECT_EQ(model->param_role("model.layers.0.self_attn.q_norm.weight"), ParamRole::kNorm);
  EXPECT_EQ(model->param_role("model.layers.1.self_attn.k_norm.weight"), ParamRole::kNorm);
  EXPECT_EQ(model->param_role("model.layers.1.self_attn.o_proj.bias"), ParamRole::kAttentionOutput);
  EXPECT_EQ(model->param_roles().at("model.layers.1.self_attn.q_proj.weight").attention_layer,
            "model.layers.1.self_attn.");
  EXPECT_EQ(model->param_role("model.layers.0.mlp.gate.weight"), ParamRole::kRouter);
  EXPECT_EQ(model->param_role("model.layers.0.mlp.experts.down_proj"), ParamRole::kExpert);
  // Without attention_bias (HF's default) no projection has a bias.
  for (const auto& item : build_model(tiny_qwen3_moe(false, false), 1)->named_parameters()) {
    EXPECT_EQ(item.key().find(".bias"), std::string::npos) << item.key();
  }
}

// HF's TopKRouter of both families, with and without norm_topk_prob (tests/python/hf_parity.py
// router), and ours (the gate's linear, then route_top_k) on the same random hidden states and
// weight.
TEST(MoeRouter, TopKChoicesAndWeightsMatchTransformers) {
  std::string dir = (std::filesystem::temp_directory_path() / "hf_router.XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const int64_t top_k = 3;
  {
    std::ofstream json(dir + "/case.json");
    json << "{\"seed\": 4, \"tokens\": 50, \"hidden\": 24, \"experts\": 7, \"top_k\": " << top_k
         << "}\n";
  }
  ASSERT_TRUE(
      test_support::python_script_succeeds({"hf_parity.py", "router", dir + "/case.json", dir}));
  std::map<std::string, torch::Tensor> hf;
  for (const auto& [name, t] : read_safetensors(dir + "/router.safetensors").tensors) hf[name] = t;
  std::filesystem::remove_all(dir);

  const auto logits = at::linear(hf.at("hidden"), hf.at("weight"));
  for (const char* family : {"qwen2_moe", "qwen3_moe"}) {
    for (const bool norm : {false, true}) {
      const std::string key = std::string(family) + (norm ? ".norm" : ".plain");
      const auto [weights, indices] = qwen2_moe::route_top_k(logits, top_k, norm);
      // The oracle checked that the top-k + 1 probabilities of every token are > 1e-4 apart, so
      // the choice and its order are exact; the weights are float32 softmax values of the same
      // float32 logits (up to GEMM summation order, ~1e-7 relative), hence 1e-6.
      EXPECT_TRUE(torch::equal(indices, hf.at(key + ".indices"))) << key;
      EXPECT_TRUE(torch::allclose(weights, hf.at(key + ".scores"), /*rtol=*/1e-6, /*atol=*/1e-7))
          << key;
      const auto sums = weights.sum(-1);
      if (norm) {
        EXPECT_TRUE(torch::allclose(sums, torch::ones_like(sums), 1e-6, 1e-6)) << key;
      } else {
        EXPECT_TRUE((sums < 1.0 - 1e-3).all().item<bool>()) << key;  // 3 of 7 < the whole
      }
    }
  }
}

TEST(Qwen2Moe, LogitsLossAndGradientsMatchTransformers) {
  auto c = tiny_config();
  moe_config(c).router_aux_loss_coef =
      0.05;  // large enough that the aux-loss term moves the gradients
  const auto r = test_support::run_hf_parity(c, 21, 2, 13);
  if (HasFailure()) return;
  test_support::expect_hf_parity(r, "qwen2_moe");
}

// Tied embeddings on a routed-expert model (Qwen3-30B-A3B is untied; the path is the shared
// wrapper's, so one MoE case covers it): no lm_head.weight, the embedding's gradient sums both
// uses; tolerances as above.
TEST(Qwen3Moe, TiedEmbeddingsMatchTransformers) {
  auto c = tiny_qwen3_moe(/*attention_bias=*/false, /*norm_topk_prob=*/true);
  c.tie_word_embeddings = true;
  moe_config(c).router_aux_loss_coef = 0.05;
  const auto r = test_support::run_hf_parity(c, 23, 2, 13);
  if (HasFailure()) return;
  EXPECT_EQ(r.grads.count("lm_head.weight"), 0u);
  test_support::expect_hf_parity(r, "qwen3_moe (tied embeddings)");
}

TEST(Qwen3Moe, LogitsLossAndGradientsMatchTransformers) {
  // HF's defaults (no attention bias, no renormalisation), then both switched on.
  for (const bool on : {false, true}) {
    auto c = tiny_qwen3_moe(/*attention_bias=*/on, /*norm_topk_prob=*/on);
    moe_config(c).router_aux_loss_coef = 0.05;
    const auto r = test_support::run_hf_parity(c, 22, 2, 13);
    if (HasFailure()) return;
    test_support::expect_hf_parity(r,
                                   on ? "qwen3_moe (attention_bias, norm_topk_prob)" : "qwen3_moe");
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
