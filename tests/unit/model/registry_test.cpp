// Model registry: name lookup, ConfigError for unknown names and impossible shapes, seeding.
#include "mixtrain/model/registry.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "mixtrain/config/model_sections.h"
#include "mixtrain/core/error.h"
#include "mixtrain/model/moe_config.h"
#include "support/tiny_model_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

ModelConfig small_config() {
  ModelConfig c;  // defaults are the tiny model; shrink the vocabulary to keep the test quick
  c.vocab_size = 50;
  return c;
}

// Runs build_model and returns the ConfigError message ("" if none was thrown).
std::string config_error(const ModelConfig& c) {
  try {
    build_model(c, 1);
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  return "";
}

// Runs build_model and returns the std::invalid_argument message ("" if none was thrown).
std::string shape_error(const ModelConfig& c) {
  try {
    build_model(c, 1);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(ModelRegistry, BuildsQwen2MoeByName) {
  const auto c = small_config();
  auto model = build_model(c, 1);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->config().name, "qwen2_moe");
  EXPECT_EQ(model->config().vocab_size, 50);
  const auto out = model->forward(torch::zeros({1, 4}, torch::kInt64));
  EXPECT_EQ(out.logits.sizes().vec(), (std::vector<int64_t>{1, 4, 50}));
}

TEST(ModelRegistry, ListsItsNames) {
  const auto names = registered_model_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "qwen2_moe"), names.end());
}

TEST(ModelRegistry, SeedDecidesTheParameters) {
  const auto c = small_config();
  auto a = build_model(c, 5), b = build_model(c, 5), d = build_model(c, 6);
  const auto pa = a->named_parameters(), pb = b->named_parameters(), pd = d->named_parameters();
  const std::string name = "model.layers.0.mlp.experts.gate_proj";
  EXPECT_TRUE(torch::equal(*pa.find(name), *pb.find(name)));
  EXPECT_FALSE(torch::equal(*pa.find(name), *pd.find(name)));
}

TEST(ModelRegistry, UnknownNameIsAConfigErrorNamingTheKey) {
  auto c = small_config();
  c.name = "llama_moe";
  const auto message = config_error(c);
  EXPECT_NE(message.find("model.name"), std::string::npos) << message;
  EXPECT_NE(message.find("llama_moe"), std::string::npos) << message;
  EXPECT_NE(message.find("qwen2_moe"), std::string::npos) << message;  // what is available
  // The key travels apart from the problem, so the CLI can spell it as the user wrote it.
  try {
    build_model(c, 1);
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "model.name");
    EXPECT_EQ(
        e.problem(),
        "unknown model 'llama_moe' (known: qwen2_moe, qwen3_moe, qwen2, llama, qwen3, mistral, "
        "deepseek_v3)");
  }
}

// The models' own shape invariants: std::invalid_argument naming the field, never a config key
// (validate_test.cpp has the same configs refused with the key as the user wrote it).
TEST(ModelRegistry, ImpossibleShapesAreInvalidArgumentsNamingTheField) {
  auto c = small_config();
  c.num_kv_heads = 3;  // does not divide num_heads = 4
  EXPECT_EQ(shape_error(c),
            "model config: num_kv_heads must be > 0 and divide num_heads (4), got 3");
  c = small_config();
  moe_config(c).num_experts_per_tok = moe_config(c).num_experts + 1;
  EXPECT_EQ(shape_error(c), "model config: num_experts_per_tok must be in [1, num_experts = " +
                                std::to_string(moe_config(c).num_experts) + "], got " +
                                std::to_string(moe_config(c).num_experts + 1));
  c = small_config();
  c.head_dim = 7;  // rotary embeddings rotate pairs
  EXPECT_NE(shape_error(c).find("head_dim"), std::string::npos);
  c = small_config();
  c.num_layers = 0;
  EXPECT_EQ(shape_error(c), "model config: num_layers must be > 0");
}

TEST(ModelRegistry, BuildsDenseQwen2ByName) {
  auto c = small_config();
  c.name = "qwen2";
  auto model = build_model(c, 1);
  EXPECT_EQ(model->config().name, "qwen2");
  const auto params = model->named_parameters();
  EXPECT_NE(params.find("model.layers.0.mlp.gate_proj.weight"), nullptr);
  EXPECT_EQ(params.find("model.layers.0.mlp.experts.gate_proj"), nullptr);
}

TEST(ModelRegistry, BuildsQwen3MoeAndLlamaByName) {
  for (const char* name : {"qwen3_moe", "llama"}) {
    auto c = small_config();
    c.name = name;
    auto model = build_model(c, 1);
    EXPECT_EQ(model->config().name, name);
    const auto out = model->forward(torch::zeros({1, 4}, torch::kInt64));
    EXPECT_EQ(out.logits.sizes().vec(), (std::vector<int64_t>{1, 4, 50})) << name;
  }
}

// config/ cannot see the registry (it sits below model/), so its per-model sections are a
// second list: both must name the same models in the same order.
TEST(ModelRegistry, ConfigSectionsNameTheSameModels) {
  std::vector<std::string> sections;
  for (const auto& section : model_sections()) sections.push_back(section.name);
  EXPECT_EQ(sections, registered_model_names());
}

// Every parameter of every registered model has a role, and exactly the MoE models have experts.
TEST(ModelRegistry, EveryParameterHasARole) {
  for (const auto& name : registered_model_names()) {
    auto c = small_config();
    c.name = name;
    // deepseek_v3: its own shapes, 3 layers of which the first is dense.
    if (name == "deepseek_v3") c = test_support::tiny_deepseek_v3();
    const auto model = build_model(c, 1);
    int experts = 0;
    for (const auto& item : model->named_parameters()) experts += model->is_expert(item.key());
    const bool moe = name == "qwen2_moe" || name == "qwen3_moe";
    EXPECT_EQ(experts, moe ? 3 * c.num_layers : name == "deepseek_v3" ? 3 * 2 : 0) << name;
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
