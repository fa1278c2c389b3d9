// Qwen3 dense (qwen3.h): Hugging Face's names, shapes and order; the roles the model declares;
// logits, loss and every gradient against transformers' Qwen3ForCausalLM on the same weights
// (tests/support/hf_parity.h: float64, the tolerances stated there); its config section through
// load_config (its keys, another model's refused, QK-clip refused for its q/k norms) and a
// model.hf_config of transformers' own Qwen3 config.json.
#include "mixtrain/model/qwen3.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/load.h"
#include "mixtrain/model/registry.h"
#include "support/hf_parity.h"
#include "support/tiny_model_config.h"
#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

// The shared tiny sizes (every one distinct, num_heads * head_dim != hidden_size), dense.
ModelConfig tiny_qwen3(bool bias) {
  ModelConfig c = test_support::tiny_config();
  c.name = "qwen3";
  c.intermediate_size = 20;
  c.attention_bias = bias;
  return c;
}

TEST(Qwen3, ParameterNamesShapesAndRolesMatchHuggingFace) {
  const int64_t V = 37, H = 24, Q = 32, KV = 16, I = 20, D = 8;
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"model.embed_tokens.weight", {V, H}}};
  for (int n = 0; n < 2; ++n) {
    const std::string p = "model.layers." + std::to_string(n) + ".";
    // Qwen3Attention registers q, k, v, o, q_norm, k_norm.
    const std::vector<std::pair<std::string, std::vector<int64_t>>> layer = {
        {"self_attn.q_proj.weight", {Q, H}},     {"self_attn.k_proj.weight", {KV, H}},
        {"self_attn.v_proj.weight", {KV, H}},    {"self_attn.o_proj.weight", {H, Q}},
        {"self_attn.q_norm.weight", {D}},        {"self_attn.k_norm.weight", {D}},
        {"mlp.gate_proj.weight", {I, H}},        {"mlp.up_proj.weight", {I, H}},
        {"mlp.down_proj.weight", {H, I}},        {"input_layernorm.weight", {H}},
        {"post_attention_layernorm.weight", {H}}};
    for (const auto& [name, shape] : layer) expected.emplace_back(p + name, shape);
  }
  expected.emplace_back("model.norm.weight", std::vector<int64_t>{H});
  expected.emplace_back("lm_head.weight", std::vector<int64_t>{V, H});

  const auto model = build_model(tiny_qwen3(false), 1);
  const auto params = model->named_parameters();
  ASSERT_EQ(params.size(), expected.size());
  size_t i = 0;
  for (const auto& item : params) {
    EXPECT_EQ(item.key(), expected[i].first);
    EXPECT_EQ(item.value().sizes().vec(), expected[i].second) << item.key();
    ++i;
  }
  EXPECT_EQ(model->param_role("model.layers.1.self_attn.q_norm.weight"), ParamRole::kNorm);
  EXPECT_EQ(model->param_role("model.layers.1.self_attn.k_proj.weight"), ParamRole::kAttentionKey);
  EXPECT_EQ(model->param_roles().at("model.layers.1.self_attn.k_proj.weight").attention_layer,
            "model.layers.1.self_attn.");
  EXPECT_EQ(model->param_role("model.layers.0.mlp.down_proj.weight"), ParamRole::kMlp);

  // With attention_bias every projection, o included, has a bias (HF Qwen3Attention).
  const auto biased = build_model(tiny_qwen3(true), 1);
  const auto named = biased->named_parameters();
  for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    EXPECT_NE(named.find(std::string("model.layers.0.self_attn.") + proj + ".bias"), nullptr)
        << proj;
  }
}

TEST(Qwen3, LogitsLossAndGradientsMatchTransformers) {
  for (const bool bias : {false, true}) {
    const auto r = test_support::run_hf_parity(tiny_qwen3(bias), 14, 2, 13);
    if (HasFailure()) return;
    test_support::expect_hf_parity(r, bias ? "qwen3 (attention_bias)" : "qwen3");
  }
}

TEST(Qwen3, ItsConfigSectionAndTransformersConfigJson) {
  testing::TempDir dir;
  const std::string base = "model:\n  name: qwen3\n  intermediate_size: 20\n";
  const ResolvedConfig ok = load_config(dir.write("ok.yaml", base), {});
  EXPECT_EQ(ok.config.model.name, "qwen3");
  // Another model's key, and QK-clip (its q/k norms make the logits scale-free), are refused.
  EXPECT_NE(testing::config_error_of([&] {
              load_config(dir.write("experts.yaml", base + "  num_experts: 8\n"), {});
            }).find("model.num_experts: is not a key of model qwen3"),
            std::string::npos);
  EXPECT_NE(testing::config_error_of([&] {
              load_config(
                  dir.write("clip.yaml", base + "optimizer:\n  _target_: Muon\n"
                                                "  muon_config:\n    muon_qk_clip_tau: 50\n"),
                  {});
            }).find("must be 0 with model.name qwen3"),
            std::string::npos);

  // transformers' own Qwen3Config, saved as config.json, read through model.hf_config.
  const std::string json_path = dir.path() + "/qwen3_config.json";
  const int status = std::system(
      (std::string(MIXTRAIN_PYTHON) +
       " -c \"import transformers; transformers.Qwen3Config("
       "vocab_size=61, hidden_size=24, num_hidden_layers=3, num_attention_heads=4, "
       "num_key_value_heads=2, head_dim=8, intermediate_size=20, max_position_embeddings=64, "
       "rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=True)"
       ".to_json_file('" +
       json_path + "')\"")
          .c_str());
  ASSERT_EQ(status, 0) << "transformers could not write " << json_path;
  const ResolvedConfig from_hf =
      load_config(dir.write("hf.yaml", "model:\n  hf_config: " + json_path + "\n"), {});
  const ModelConfig& m = from_hf.config.model;
  EXPECT_EQ(m.name, "qwen3");
  EXPECT_EQ(m.vocab_size, 61);
  EXPECT_EQ(m.num_layers, 3);
  EXPECT_EQ(m.head_dim, 8);
  EXPECT_EQ(m.intermediate_size, 20);
  EXPECT_TRUE(m.attention_bias);
  EXPECT_EQ(from_hf.leaf("model.attention_bias")->origin, json_path + ": attention_bias");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
