// Dense Qwen2: parameter names/shapes (HF's), roles, registry entry, and the forward logits
// against Hugging Face transformers' Qwen2ForCausalLM (tests/python/hf_qwen2_forward.py) run in
// float64 on the same weights.
#include "mixtrain/model/qwen2.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/safetensors.h"
#include "mixtrain/model/registry.h"

namespace mixtrain {
namespace {

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
  EXPECT_EQ(model->param_role("model.layers.1.self_attn.k_proj.bias"), ParamRole::kAttention);
  EXPECT_EQ(model->param_role("model.layers.0.self_attn.o_proj.weight"), ParamRole::kAttention);
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

// Weights far from the HF init (zero biases, unit norms) so every parameter moves the logits:
// a dropped bias or norm scale, or a mixed-up projection, changes them by O(1).
void randomize(torch::nn::Module& model, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    auto& p = item.value();
    const std::string& name = item.key();
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.normal_(0.0, 0.3, gen);
    } else if (p.dim() == 1) {  // norm scales
      p.normal_(1.0, 0.2, gen);
    } else if (name == "model.embed_tokens.weight") {
      p.normal_(0.0, 1.0, gen);
    } else {
      p.normal_(0.0, 1.0 / std::sqrt(double(p.size(1))), gen);
    }
  }
}

std::string temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "qwen2_test.XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

TEST(Qwen2, LogitsMatchTransformersQwen2ForCausalLM) {
  const auto c = tiny_dense();
  const auto model = build_model(c, 7);
  randomize(*model, 11);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto ids = torch::randint(c.vocab_size, {2, 13}, gen, torch::kInt64);
  torch::Tensor ours;
  {
    torch::NoGradGuard no_grad;
    ours = model->forward(ids).logits.to(torch::kFloat64);
  }

  const std::string dir = temp_dir();
  NamedTensors weights;
  for (const auto& item : model->named_parameters()) {
    weights.emplace_back(item.key(), item.value().detach());
  }
  write_safetensors(dir + "/weights.safetensors", weights);
  write_safetensors(dir + "/ids.safetensors", {{"input_ids", ids}});
  {
    std::ofstream json(dir + "/config.json");
    json << "{\"vocab_size\": " << c.vocab_size << ", \"hidden_size\": " << c.hidden_size
         << ", \"num_layers\": " << c.num_layers << ", \"num_heads\": " << c.num_heads
         << ", \"num_kv_heads\": " << c.num_kv_heads << ", \"head_dim\": " << c.head_dim
         << ", \"intermediate_size\": " << c.intermediate_size
         << ", \"max_seq_len\": " << c.max_seq_len << ", \"rope_theta\": " << c.rope_theta
         << ", \"rms_norm_eps\": " << c.rms_norm_eps << "}\n";
  }
  const std::string command = std::string("'") + MIXTRAIN_PYTHON + "' '" + MIXTRAIN_SOURCE_DIR +
                              "/tests/python/hf_qwen2_forward.py' '" + dir + "/config.json' '" +
                              dir + "/weights.safetensors' '" + dir + "/ids.safetensors' '" + dir +
                              "/logits.safetensors'";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const auto reference = read_safetensors(dir + "/logits.safetensors").tensors.at(0).second;
  std::filesystem::remove_all(dir);

  ASSERT_EQ(reference.sizes(), ours.sizes());
  // Ours runs in float32 (flash attention, float32 GEMMs), the reference in float64: the
  // difference is float32 rounding only. Unit roundoff u = 2^-24 = 6e-8; a logit is the end of
  // ~20 sequential rounded ops (2 layers of norm, 3 projections, attention, MLP, then norm and
  // lm_head), each a dot product of at most 32 terms, so a few 1e-7 to 1e-6 of the logits'
  // scale (measured when written: 1.2e-6 at max |logit| 3.3, i.e. 3.6e-7 relative). The bound,
  // 1e-5 of the scale, is ~30x that. Deliberate changes to the HF model with these weights
  // move the logits by far more (measured when written, as a fraction of the scale: one
  // layer's q bias zeroed 0.21, one norm scale set to ones 0.19, rope_theta x10 0.09).
  const double scale = reference.abs().max().item<double>();
  const double max_error = (ours - reference).abs().max().item<double>();
  EXPECT_GT(scale, 1.0);
  EXPECT_LE(max_error, 1e-5 * scale) << "max |ours - HF| " << max_error << ", max |HF| " << scale;
  std::printf("qwen2 vs transformers: max |ours - HF| = %.3g, max |HF| = %.3g\n", max_error, scale);
}

}  // namespace
}  // namespace mixtrain
