// Mistral (mistral.h): Hugging Face's names and shapes (no bias anywhere); logits, loss and every
// gradient against transformers' MistralForCausalLM on the same weights with a window shorter than
// the sequence and with none (tests/support/hf_parity.h: float64, the tolerances stated there);
// the window changes the logits (so the parity case exercises it); its config section (its keys,
// attention_bias and other models' keys refused, a window with context parallelism refused
// naming parallel.cp); model.hf_config of transformers' own MistralConfig, with a window and
// with null.
#include "mixtrain/model/mistral.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/load.h"
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
