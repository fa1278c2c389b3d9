// Mistral (mistral.h): Hugging Face's names and shapes (no bias anywhere); logits, loss and every
// gradient against transformers' MistralForCausalLM on the same weights with a window shorter than
// the sequence and with none (tests/support/hf_parity.h: float64, the tolerances stated there);
// the window changes the logits (so the parity case exercises it); its config section (its keys,
// attention_bias and other models' keys refused, a window with context parallelism refused
// naming parallel.cp); model.hf_config of transformers' own MistralConfig, with a window and
// with null; QK-clip's max logits recorded through the whole windowed model against a float64
// computation that keeps only the window's pairs.
#include "mixtrain/model/mistral.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/load.h"
#include "mixtrain/model/max_logit_recorder.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/model/sliding_window_config.h"
#include "support/hf_parity.h"
#include "support/tiny_model_config.h"
#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

// The shared tiny sizes (every one distinct), dense, no bias, the given window.
ModelConfig tiny_mistral(int64_t window) {
  ModelConfig c = test_support::tiny_config();
  c.name = "mistral";
  c.intermediate_size = 20;
  c.attention_bias = false;
  sliding_window_config(c).sliding_window = window;
  return c;
}

TEST(Mistral, ParameterNamesAndShapesMatchHuggingFace) {
  const auto model = build_model(tiny_mistral(5), 1);
  const auto params = model->named_parameters();
  // embed, 2 x (q, k, v, o, gate, up, down, 2 norms), norm, lm_head: no bias.
  EXPECT_EQ(params.size(), 1u + 2 * 9 + 2);
  for (const auto& item : params) {
    EXPECT_EQ(item.key().find(".bias"), std::string::npos) << item.key();
  }
  EXPECT_EQ(params["model.layers.1.self_attn.q_proj.weight"].sizes().vec(),
            (std::vector<int64_t>{32, 24}));
  EXPECT_EQ(model->param_role("model.layers.1.self_attn.o_proj.weight"),
            ParamRole::kAttentionOutput);
}

// Window 5 over 13 positions: positions 5.. lose their earliest keys; HF's mask
// (kv_idx > q_idx - sliding_window) and ours must agree on every one of them.
TEST(Mistral, SlidingWindowLogitsLossAndGradientsMatchTransformers) {
  for (const int64_t window : {int64_t{5}, int64_t{0}}) {
    const auto r = test_support::run_hf_parity(tiny_mistral(window), 16, 2, 13);
    if (HasFailure()) return;
    test_support::expect_hf_parity(r, "mistral (window " + std::to_string(window) + ")");
  }
}

// The window is not a no-op on this case: against full attention on the same weights, the
// logits of the positions past the window move by a sizeable part of their scale (the parity
// tolerance is 1e-5 of it), and those inside it stay bitwise.
TEST(Mistral, TheWindowChangesOnlyThePositionsPastIt) {
  const auto windowed = build_model(tiny_mistral(5), 7);
  const auto full = build_model(tiny_mistral(0), 7);
  const auto ids = torch::randint(37, {2, 13}, torch::kInt64);
  torch::NoGradGuard no_grad;
  const auto a = windowed->forward(ids).logits, b = full->forward(ids).logits;
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, 5), b.narrow(1, 0, 5)));
  const double moved = (a.narrow(1, 5, 8) - b.narrow(1, 5, 8)).abs().max().item<double>();
  EXPECT_GT(moved, 1e-3 * b.abs().max().item<double>());
}

// QK-clip's recording through the whole windowed model (window 3, sequences of 9 and 12): each
// head's recorded max logit is the max over the pairs the window lets through (query i, key j,
// i - 3 < j <= i), not over every causal pair. Layer 0's is recomputed here in float64 from the
// parameters: embedding rows, input RMSNorm, q/k projections (no bias), rotary written out, the
// scaled dot products under the causal mask and the window. The same products without the window
// give a larger max for some head (the case is built so: q/k weights scaled for large, distinct
// logits; checked below), so a recorder that ignored the window would be off by far more than
// the tolerance (measured: head 2's max is 41.2 in the window, 52.7 without it): the float32
// model against float64 is a few 1e-6 on logits of ~40 (as the Qwen2 test of this recording);
// 1e-4 absolute. Checked to fail when model/layers.cpp records causal_max_logits without the
// window and when attention.cpp's causal_max_logits drops its window mask.
TEST(Mistral, RecordsEachHeadsMaxLogitOverTheWindowsPairsOnly) {
  constexpr int64_t kWindow = 3;
  const auto c = tiny_mistral(kWindow);
  const auto model = build_model(c, 5);
  std::map<std::string, torch::Tensor> p;
  for (const auto& item : model->named_parameters()) p[item.key()] = item.value();
  {
    torch::NoGradGuard no_grad;
    p["model.layers.0.self_attn.q_proj.weight"].mul_(40);
    p["model.layers.0.self_attn.k_proj.weight"].mul_(40);
  }
  auto recorder = std::make_shared<MaxLogitRecorder>();
  model->set_max_logit_recorder(recorder);
  torch::manual_seed(11);
  const std::vector<torch::Tensor> batches = {torch::randint(37, {2, 9}, torch::kInt64),
                                              torch::randint(37, {3, 12}, torch::kInt64)};
  for (const auto& ids : batches) model->forward(ids);
  ASSERT_EQ(recorder->layers().count("model.layers.0.self_attn."), 1u);
  const torch::Tensor got = recorder->layers().at("model.layers.0.self_attn.");

  auto d = [&](const std::string& name) { return p.at(name).detach().to(torch::kDouble); };
  // Position m turns the pair (x_i, x_{i+4}) of each 8-wide head by m * theta^(-2i/8), i < 4
  // (HF's rotate_half layout).
  auto rotate = [&](const torch::Tensor& x) {  // [B, heads, S, 8]
    const int64_t seq = x.size(2);
    const auto position = torch::arange(seq, torch::kDouble).unsqueeze(1);
    const auto inv_freq = torch::pow(c.rope_theta, -torch::arange(0, 8, 2, torch::kDouble) / 8.0);
    const auto angle = position * inv_freq.unsqueeze(0);  // [S, 4]
    const auto cos = angle.cos(), sin = angle.sin();
    const auto x1 = x.narrow(-1, 0, 4), x2 = x.narrow(-1, 4, 4);
    return torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  };
  const double minus_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> windowed(c.num_heads, minus_inf), causal(c.num_heads, minus_inf);
  for (const auto& ids : batches) {
    const int64_t seq = ids.size(1);
    auto h = d("model.embed_tokens.weight").index_select(0, ids.reshape({-1})).view({-1, seq, 24});
    h = h * torch::rsqrt(h.pow(2).mean(-1, true) + c.rms_norm_eps) *
        d("model.layers.0.input_layernorm.weight");
    const std::string a = "model.layers.0.self_attn.";
    auto q = torch::matmul(h, d(a + "q_proj.weight").t()).view({-1, seq, 4, 8}).transpose(1, 2);
    auto k = torch::matmul(h, d(a + "k_proj.weight").t()).view({-1, seq, 2, 8}).transpose(1, 2);
    q = rotate(q);
    k = rotate(k);
    // Query i sees key j when j <= i, and with the window when also j > i - kWindow.
    const auto i = torch::arange(seq).unsqueeze(1), j = torch::arange(seq).unsqueeze(0);
    const auto future = j > i, outside = future.logical_or(j <= i - kWindow);
    for (int64_t head = 0; head < 4; ++head) {
      const auto logits =
          torch::matmul(q.select(1, head), k.select(1, head / 2).transpose(1, 2)) / std::sqrt(8.0);
      windowed[head] =
          std::max(windowed[head], logits.masked_fill(outside, minus_inf).max().item<double>());
      causal[head] =
          std::max(causal[head], logits.masked_fill(future, minus_inf).max().item<double>());
    }
  }
  int64_t window_matters = 0;
  for (int64_t head = 0; head < 4; ++head) {
    std::cout << "head " << head << ": max logit " << got[head].item<double>() << " (float64 "
              << windowed[head] << " in the window, " << causal[head] << " without it)\n";
    EXPECT_NEAR(got[head].item<double>(), windowed[head], 1e-4) << head;
    window_matters += causal[head] > windowed[head] + 1.0;
  }
  EXPECT_GT(window_matters, 0) << "no head's max lies outside the window: the case cannot tell";
  EXPECT_GT(*std::max_element(windowed.begin(), windowed.end()), 1.0) << "logits too small";
}

TEST(Mistral, ItsConfigSectionAndTransformersConfigJson) {
  testing::TempDir dir;
  const std::string base = "model:\n  name: mistral\n  intermediate_size: 20\n";
  const ResolvedConfig ok = load_config(dir.write("ok.yaml", base + "  sliding_window: 16\n"), {});
  EXPECT_EQ(sliding_window_config(ok.config.model).sliding_window, 16);
  const auto error = [&](const std::string& name, const std::string& text) {
    return testing::config_error_of([&] { load_config(dir.write(name, text), {}); });
  };
  EXPECT_NE(error("bias.yaml", base + "  attention_bias: false\n")
                .find("model.attention_bias: is not a key of model mistral"),
            std::string::npos);
  EXPECT_NE(
      error("neg.yaml", base + "  sliding_window: -1\n").find("model.sliding_window: must be >= 0"),
      std::string::npos);
  EXPECT_NE(error("qwen2.yaml", "model:\n  name: qwen2\n  sliding_window: 8\n")
                .find("model.sliding_window: is not a key of model qwen2"),
            std::string::npos);
  EXPECT_NE(error("cp.yaml", base + "  sliding_window: 16\nparallel:\n  cp: 2\n  dp_shard: 1\n")
                .find("parallel.cp: must be 1 with model.sliding_window (16)"),
            std::string::npos);

  // transformers' own MistralConfig, saved as config.json, read through model.hf_config.
  for (const std::string window : {"7", "None"}) {
    const std::string json_path = dir.path() + "/mistral_" + window + ".json";
    const int status = std::system(
        (std::string(MIXTRAIN_PYTHON) +
         " -c \"import transformers; transformers.MistralConfig("
         "vocab_size=61, hidden_size=24, num_hidden_layers=3, num_attention_heads=4, "
         "num_key_value_heads=2, head_dim=8, intermediate_size=20, max_position_embeddings=64, "
         "rms_norm_eps=1e-6, sliding_window=" +
         window + ").to_json_file('" + json_path + "')\"")
            .c_str());
    ASSERT_EQ(status, 0) << "transformers could not write " << json_path;
    const ResolvedConfig from_hf =
        load_config(dir.write("hf.yaml", "model:\n  hf_config: " + json_path + "\n"), {});
    const ModelConfig& m = from_hf.config.model;
    EXPECT_EQ(m.name, "mistral");
    EXPECT_EQ(m.num_layers, 3);
    EXPECT_EQ(m.intermediate_size, 20);
    EXPECT_EQ(sliding_window_config(m).sliding_window, window == "7" ? 7 : 0);
    EXPECT_EQ(from_hf.leaf("model.sliding_window")->origin, window == "7"
                                                                ? json_path + ": sliding_window"
                                                                : json_path +
                                                                      ": default: null "
                                                                      "(full causal)");
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
