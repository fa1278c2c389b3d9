// The dense decoders, Qwen2 and Llama: parameter names/shapes (HF's), roles, registry entry, and
// logits, loss and every gradient against Hugging Face transformers' Qwen2ForCausalLM and
// LlamaForCausalLM (also with Llama 3.1's rope scaling) run in float64 on the same weights
// (tests/support/hf_parity.h).
#include "mixtrain/model/qwen2.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/model/layers.h"
#include "mixtrain/model/registry.h"
#include "support/hf_parity.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

// Every size distinct, and num_heads * head_dim != hidden_size, so a transposed or mixed-up
// dimension cannot go unnoticed.
ModelConfig tiny_dense() {
  ModelConfig c;
  c.name = "qwen2";
  c.vocab_size = 37;
  c.hidden_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 20;
  c.max_seq_len = 16;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  return c;
}

TEST(Qwen2, ParameterNamesAndShapesMatchHuggingFace) {
  const auto c = tiny_dense();
  const int64_t V = 37, H = 24, Q = 32, KV = 16, I = 20;
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"model.embed_tokens.weight", {V, H}}};
  for (int n = 0; n < 2; ++n) {
    const std::string p = "model.layers." + std::to_string(n) + ".";
    const std::vector<std::pair<std::string, std::vector<int64_t>>> layer = {
        {"self_attn.q_proj.weight", {Q, H}},  {"self_attn.q_proj.bias", {Q}},
        {"self_attn.k_proj.weight", {KV, H}}, {"self_attn.k_proj.bias", {KV}},
        {"self_attn.v_proj.weight", {KV, H}}, {"self_attn.v_proj.bias", {KV}},
        {"self_attn.o_proj.weight", {H, Q}},  {"mlp.gate_proj.weight", {I, H}},
        {"mlp.up_proj.weight", {I, H}},       {"mlp.down_proj.weight", {H, I}},
        {"input_layernorm.weight", {H}},      {"post_attention_layernorm.weight", {H}}};
    for (const auto& [name, shape] : layer) expected.emplace_back(p + name, shape);
  }
  expected.emplace_back("model.norm.weight", std::vector<int64_t>{H});
  expected.emplace_back("lm_head.weight", std::vector<int64_t>{V, H});

  const auto model = qwen2::make_qwen2(c, 1);
  const auto params = model->named_parameters();
  ASSERT_EQ(params.size(), expected.size());
  size_t i = 0;
  for (const auto& item : params) {  // registration order = HF state_dict order
    EXPECT_EQ(item.key(), expected[i].first);
    EXPECT_EQ(item.value().sizes().vec(), expected[i].second) << item.key();
    ++i;
  }
}

TEST(Qwen2, TheModelNamesTheRoleOfEveryParameter) {
  const auto model = build_model(tiny_dense(), 1);
  EXPECT_EQ(model->param_role("model.embed_tokens.weight"), ParamRole::kEmbedding);
  EXPECT_EQ(model->param_role("model.layers.1.self_attn.k_proj.bias"), ParamRole::kAttentionKey);
  EXPECT_EQ(model->param_role("model.layers.0.self_attn.o_proj.weight"),
            ParamRole::kAttentionOutput);
  EXPECT_EQ(model->param_role("model.layers.0.mlp.down_proj.weight"), ParamRole::kMlp);
  EXPECT_EQ(model->param_role("model.layers.1.input_layernorm.weight"), ParamRole::kNorm);
  EXPECT_EQ(model->param_role("model.norm.weight"), ParamRole::kNorm);
  EXPECT_EQ(model->param_role("lm_head.weight"), ParamRole::kOutputHead);
  for (const auto& item : model->named_parameters()) EXPECT_FALSE(model->is_expert(item.key()));
  EXPECT_THROW(model->param_role("model.layers.0.mlp.experts.gate_proj"), std::invalid_argument);
}

TEST(Qwen2, HasNoRouterLoss) {
  const auto model = build_model(tiny_dense(), 3);
  const auto out = model->forward(torch::zeros({2, 5}, torch::kInt64));
  EXPECT_EQ(out.logits.sizes().vec(), (std::vector<int64_t>{2, 5, 37}));
  EXPECT_EQ(out.aux_loss.scalar_type(), torch::kFloat32);
  EXPECT_EQ(out.aux_loss.item<float>(), 0.0f);
}

// QK-clip's recording through the whole model: with a MaxLogitRecorder installed, two forwards
// leave per layer the max over both of each head's causal logit. Layer 0's is recomputed here in
// float64 from the parameters: embedding rows, input RMSNorm, q/k projections with biases,
// rotary (the model's tables), then the scaled dot products under the causal mask.
TEST(Qwen2, RecordsEachHeadsMaxCausalLogitOverTheForwards) {
  const auto c = tiny_dense();
  const auto model = build_model(c, 5);
  std::map<std::string, torch::Tensor> p;
  for (const auto& item : model->named_parameters()) p[item.key()] = item.value();
  {
    torch::NoGradGuard no_grad;  // large, distinct logits per head; nonzero biases
    p["model.layers.0.self_attn.q_proj.weight"].mul_(40);
    p["model.layers.0.self_attn.k_proj.weight"].mul_(40);
    p["model.layers.0.self_attn.q_proj.bias"].copy_(torch::linspace(-1, 1, 32));
    p["model.layers.0.self_attn.k_proj.bias"].copy_(torch::linspace(1, -0.5, 16));
  }
  EXPECT_TRUE(model->forward(torch::zeros({1, 4}, torch::kInt64)).logits.defined());
  auto recorder = std::make_shared<MaxLogitRecorder>();
  model->set_max_logit_recorder(recorder);
  const std::vector<torch::Tensor> batches = {torch::randint(37, {2, 6}, torch::kInt64),
                                              torch::randint(37, {3, 5}, torch::kInt64)};
  for (const auto& ids : batches) model->forward(ids);
  ASSERT_EQ(recorder->layers().size(), 2u);
  ASSERT_EQ(recorder->layers().count("model.layers.1.self_attn."), 1u);
  const torch::Tensor got = recorder->layers().at("model.layers.0.self_attn.");

  auto d = [&](const std::string& name) { return p.at(name).detach().to(torch::kDouble); };
  // Rotary embedding written out here in float64, not the model's tables: position m turns the
  // pair (x_i, x_{i+4}) of each 8-wide head by the angle m * theta^(-2i/8), i < 4 (HF's
  // rotate_half layout: x' = x cos + (-x_{i+4}, x_i) sin).
  auto rotate = [&](const torch::Tensor& x) {  // [B, heads, S, 8]
    const int64_t seq = x.size(2);
    const auto position = torch::arange(seq, torch::kDouble).unsqueeze(1);
    const auto inv_freq = torch::pow(c.rope_theta, -torch::arange(0, 8, 2, torch::kDouble) / 8.0);
    const auto angle = position * inv_freq.unsqueeze(0);  // [S, 4]
    const auto cos = angle.cos(), sin = angle.sin();
    const auto x1 = x.narrow(-1, 0, 4), x2 = x.narrow(-1, 4, 4);
    return torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  };
  std::vector<double> expected(c.num_heads, -std::numeric_limits<double>::infinity());
  for (const auto& ids : batches) {
    const int64_t seq = ids.size(1);
    auto h = d("model.embed_tokens.weight").index_select(0, ids.reshape({-1})).view({-1, seq, 24});
    h = h * torch::rsqrt(h.pow(2).mean(-1, true) + c.rms_norm_eps) *
        d("model.layers.0.input_layernorm.weight");
    const std::string a = "model.layers.0.self_attn.";
    auto q = (torch::matmul(h, d(a + "q_proj.weight").t()) + d(a + "q_proj.bias"))
                 .view({-1, seq, 4, 8})
                 .transpose(1, 2);
    auto k = (torch::matmul(h, d(a + "k_proj.weight").t()) + d(a + "k_proj.bias"))
                 .view({-1, seq, 2, 8})
                 .transpose(1, 2);
    q = rotate(q);
    k = rotate(k);
    const auto future = torch::ones({seq, seq}, torch::kBool).triu(1);
    for (int64_t head = 0; head < 4; ++head) {
      const auto logits =
          torch::matmul(q.select(1, head), k.select(1, head / 2).transpose(1, 2)) / std::sqrt(8.0);
      expected[head] = std::max(expected[head],
                                logits.masked_fill(future, -std::numeric_limits<double>::infinity())
                                    .max()
                                    .item<double>());
    }
  }
  // The float32 model against float64: the embedding, norm and GEMMs round each value to about
  // 1e-7 relative, and its float32 rotary tables are off by about 1e-7 relative too (the angle
  // m * inv_freq, m <= 5, rounded to float32: <= 3e-7 rad); logits here are 26-38, moved by a few
  // 1e-6 by all that: 1e-4 absolute is ~30x it.
  for (int64_t head = 0; head < 4; ++head) {
    std::cout << "head " << head << ": max logit " << got[head].item<double>() << " (float64 "
              << expected[head] << ")\n";
    EXPECT_NEAR(got[head].item<double>(), expected[head], 1e-4) << head;
  }
  EXPECT_GT(*std::max_element(expected.begin(), expected.end()), 1.0) << "logits too small to test";
  model->set_max_logit_recorder(nullptr);
  model->forward(batches[0]);
  EXPECT_TRUE(torch::equal(recorder->layers().at("model.layers.0.self_attn."), got))
      << "no recording once removed";
}

// A shape invariant of the model, not a config error (validate_test.cpp names the key).
TEST(Qwen2, ImpossibleShapesAreInvalidArgumentsNamingTheField) {
  auto c = tiny_dense();
  c.intermediate_size = 0;
  try {
    build_model(c, 1);
    ADD_FAILURE() << "no std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "model config: intermediate_size must be > 0");
  }
}

TEST(Qwen2, RefusesBiasFreeAttention) {
  auto c = tiny_dense();
  c.attention_bias = false;  // HF Qwen2 has q/k/v biases unconditionally
  try {
    build_model(c, 1);
    ADD_FAILURE() << "no std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("attention_bias must be true for qwen2"),
              std::string::npos)
        << e.what();
  }
}

ModelConfig tiny_llama(bool attention_bias) {
  auto c = tiny_dense();
  c.name = "llama";
  c.attention_bias = attention_bias;
  return c;
}

// Llama is the dense decoder with attention_bias on q/k/v and o alike (HF LlamaAttention).
TEST(Llama, AttentionBiasesFollowTheKey) {
  for (const bool bias : {false, true}) {
    const auto model = build_model(tiny_llama(bias), 1);
    const auto params = model->named_parameters();
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      const std::string name = std::string("model.layers.1.self_attn.") + proj + ".bias";
      EXPECT_EQ(params.find(name) != nullptr, bias) << name;
    }
    EXPECT_EQ(params.size(), size_t(3 + 2 * (9 + (bias ? 4 : 0))));
    EXPECT_EQ(params["model.layers.0.self_attn.o_proj.weight"].sizes().vec(),
              (std::vector<int64_t>{24, 32}));
    if (bias) {
      EXPECT_EQ(params["model.layers.0.self_attn.o_proj.bias"].sizes().vec(),
                (std::vector<int64_t>{24}));
      EXPECT_EQ(model->param_role("model.layers.0.self_attn.o_proj.bias"),
                ParamRole::kAttentionOutput);
    }
    EXPECT_EQ(model->param_role("model.layers.0.mlp.up_proj.weight"), ParamRole::kMlp);
    const auto out = model->forward(torch::zeros({1, 4}, torch::kInt64));
    EXPECT_EQ(out.aux_loss.item<float>(), 0.0f);
  }
}

TEST(Qwen2, LogitsLossAndGradientsMatchTransformers) {
  const auto r = test_support::run_hf_parity(tiny_dense(), 11, 2, 13);
  if (HasFailure()) return;
  test_support::expect_hf_parity(r, "qwen2");
}

TEST(Llama, LogitsLossAndGradientsMatchTransformers) {
  for (const bool bias : {false, true}) {
    const auto r = test_support::run_hf_parity(tiny_llama(bias), 12, 2, 13);
    if (HasFailure()) return;
    test_support::expect_hf_parity(r, bias ? "llama (attention_bias)" : "llama");
  }
}

// Tied embeddings (Qwen2.5-0.5B, Llama-3.2-1B): no lm_head.weight; the head is the embedding, and
// HF's gradient of model.embed_tokens.weight (one tensor in HF too) sums the lookup's and the
// head's. The same tolerances as untied: the head's gradient adds one more [N, V] x [N, H]
// product to the embedding's, the same order of rounding as lm_head's own.
TEST(Qwen2, TiedEmbeddingsMatchTransformers) {
  ModelConfig c = tiny_dense();
  c.tie_word_embeddings = true;
  const auto model = build_model(c, 3);
  bool head = false, embedding = false;
  for (const auto& item : model->named_parameters()) {
    head |= item.key() == "lm_head.weight";
    embedding |= item.key() == "model.embed_tokens.weight";
  }
  EXPECT_FALSE(head) << "a tied model has no lm_head.weight";
  EXPECT_TRUE(embedding);
  const auto r = test_support::run_hf_parity(c, 14, 2, 13);
  if (HasFailure()) return;
  test_support::expect_hf_parity(r, "qwen2 (tied embeddings)");
}

TEST(Llama, TiedEmbeddingsMatchTransformers) {
  ModelConfig c = tiny_llama(false);
  c.tie_word_embeddings = true;
  const auto r = test_support::run_hf_parity(c, 15, 2, 13);
  if (HasFailure()) return;
  test_support::expect_hf_parity(r, "llama (tied embeddings)");
}

// tiny_llama with Llama 3.1's rope scaling factors and the original context shrunk to 100.
ModelConfig tiny_llama3() {
  auto c = tiny_llama(false);
  c.rope_scaling = "llama3";
  c.rope_scaling_factor = 8.0;
  c.rope_low_freq_factor = 1.0;
  c.rope_high_freq_factor = 4.0;
  c.rope_original_max_seq_len = 100;
  return c;
}

// Llama 3.1's rope scaling (factor 8, low_freq_factor 1, high_freq_factor 4) with the original
// context shrunk to 100 so that head_dim 8's four wavelengths 2 pi theta^(2i/8) = 6.3, 63, 628,
// 6283 fall in all three bands: 6.3 < 100/4 kept, 63 between 25 and 100 smoothed, 628 and 6283
// > 100 divided by 8. The oracle fails unless the scaling moves HF's logits by >= 1e-2 of their
// scale, so this case tests the scaled frequencies, not only the key plumbing.
TEST(Llama, Llama3RopeScalingMatchesTransformers) {
  auto c = tiny_llama3();
  c.max_seq_len = 128;
  const auto r = test_support::run_hf_parity(c, 13, 2, 32);
  if (HasFailure()) return;
  test_support::expect_hf_parity(r, "llama (llama3 rope scaling)");
}

// YaRN on a dense decoder (Qwen2.5's long-context scheme): no mscale given, so the rotary tables
// are multiplied by the attention factor 0.1 ln(4) + 1 = 1.139 (HF's), and the original context
// of 8 puts the ramp inside head_dim 8's four dims (the oracle fails unless the scaling moves the
// logits by >= 1e-2 of their scale). Tolerances: support/hf_parity.h.
TEST(Llama, YarnRopeScalingMatchesTransformers) {
  auto c = tiny_llama(false);
  c.rope_scaling = "yarn";
  c.rope_scaling_factor = 4.0;
  c.rope_original_max_seq_len = 8;
  c.max_seq_len = 32;
  const auto r = test_support::run_hf_parity(c, 16, 2, 24);
  if (HasFailure()) return;
  test_support::expect_hf_parity(r, "llama (yarn rope scaling)");
}

// YaRN's frequencies and attention factor against the formula evaluated here in float64: with
// d 8, theta 10000, L 8, beta 32 / 1: r(b) = 8 ln(8 / (2 pi b)) / (2 ln 10000), low =
// max(floor(r(32)), 0) = 0, high = min(ceil(r(1)), 7) = 1: dim 0 keeps its frequency, dims 1-3
// are divided by the factor (ramp 1); float32 against float64: 1e-6 relative.
TEST(Llama, YarnInverseFrequenciesAndAttentionFactorFollowTheFormula) {
  auto c = tiny_llama(false);
  c.rope_theta = 10000.0;
  c.rope_scaling = "yarn";
  c.rope_scaling_factor = 4.0;
  c.rope_original_max_seq_len = 8;
  const auto ours = rotary_inv_freq(c);
  ASSERT_EQ(ours.numel(), 4);
  const double pi = 3.14159265358979323846;
  const auto r = [&](double b) { return 8 * std::log(8 / (2 * pi * b)) / (2 * std::log(10000.0)); };
  const double low = std::max(std::floor(r(32)), 0.0), high = std::min(std::ceil(r(1)), 7.0);
  for (int64_t i = 0; i < 4; ++i) {
    const double base = std::pow(10000.0, -2.0 * i / 8);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double want = base * (1 - ramp) + base / 4 * ramp;
    EXPECT_NEAR(ours[i].item<double>(), want, 1e-6 * want) << i;
  }
  EXPECT_NEAR(rope_attention_factor(c), 0.1 * std::log(4.0) + 1, 1e-15);
  c.rope_yarn_mscale = 1.0;
  c.rope_yarn_mscale_all_dim = 1.0;
  EXPECT_EQ(rope_attention_factor(c), 1.0);  // DeepSeek-V3's: the factor moves to the softmax
  c.rope_scaling = "none";
  EXPECT_EQ(rope_attention_factor(c), 1.0);
}

// The scaled frequencies against the formula evaluated here in float64 (the three bands written
// out), to float32 rounding: ours are float32 (as HF's), a few
// ulps (1e-7 relative) from float64; bound 1e-6 relative. No scaling leaves them unchanged.
TEST(Llama, Llama3InverseFrequenciesFollowTheBands) {
  auto c = tiny_llama3();
  c.rope_theta = 10000.0;
  const auto ours = rotary_inv_freq(c);
  ASSERT_EQ(ours.scalar_type(), torch::kFloat32);
  ASSERT_EQ(ours.numel(), 4);
  const double pi = 3.14159265358979323846;
  for (int64_t i = 0; i < 4; ++i) {
    const double f = std::pow(10000.0, -2.0 * i / 8.0), wavelen = 2 * pi / f;
    double expected = f;  // wavelen < 100 / 4
    if (wavelen > 100.0) {
      expected = f / 8.0;
    } else if (wavelen >= 25.0) {
      const double s = (100.0 / wavelen - 1.0) / (4.0 - 1.0);
      expected = (1 - s) * f / 8.0 + s * f;
    }
    EXPECT_NEAR(ours[i].item<double>(), expected, 1e-6 * expected) << i;
  }
  c.rope_scaling = "none";
  const auto plain = rotary_inv_freq(c);
  for (int64_t i = 0; i < 4; ++i) {
    const double f = std::pow(10000.0, -2.0 * i / 8.0);
    EXPECT_NEAR(plain[i].item<double>(), f, 1e-6 * f) << i;
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
