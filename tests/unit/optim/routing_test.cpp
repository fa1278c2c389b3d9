#include "mixtrain/optim/routing.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sstream>

#include "mixtrain/core/error.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/muon_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

// Expected routing of one parameter, written by hand from the rules of docs/architecture.md §5.
struct Expected {
  std::string name;
  std::vector<int64_t> shape;
  std::string yaml;    // _target_ Muon, yaml rule
  bool yaml_no_decay;  // AdamW param exempt from weight decay (bias/norm/ln_)
  std::string toml;    // _target_ Muon, toml rule
};

const std::string kA = "adamw";
const std::string kM = "muon";

// The tiny Qwen2-MoE (src/mixtrain/model/qwen2_moe.cpp): V=512, H=64, 4 heads x 16, 2 KV
// heads, E=4 experts with I=32, shared expert 128, two layers.
std::vector<Expected> qwen2_moe_expectations() {
  const int64_t V = 512, H = 64, KV = 32, E = 4, I = 32, S = 128;
  std::vector<Expected> params = {{"model.embed_tokens.weight", {V, H}, kA, false, kA}};
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    std::vector<Expected> layer_params = {
        {p + "self_attn.q_proj.weight", {H, H}, kM, false, kM},
        {p + "self_attn.q_proj.bias", {H}, kA, true, kA},
        {p + "self_attn.k_proj.weight", {KV, H}, kM, false, kM},
        {p + "self_attn.k_proj.bias", {KV}, kA, true, kA},
        {p + "self_attn.v_proj.weight", {KV, H}, kM, false, kM},
        {p + "self_attn.v_proj.bias", {KV}, kA, true, kA},
        {p + "self_attn.o_proj.weight", {H, H}, kM, false, kM},
        {p + "mlp.gate.weight", {E, H}, kM, false, kM},
        {p + "mlp.experts.gate_proj", {E, I, H}, kM, false, kM},
        {p + "mlp.experts.up_proj", {E, I, H}, kM, false, kM},
        {p + "mlp.experts.down_proj", {E, H, I}, kM, false, kM},
        {p + "mlp.shared_expert.gate_proj.weight", {S, H}, kM, false, kM},
        {p + "mlp.shared_expert.up_proj.weight", {S, H}, kM, false, kM},
        {p + "mlp.shared_expert.down_proj.weight", {H, S}, kM, false, kM},
        {p + "mlp.shared_expert_gate.weight", {1, H}, kM, false, kM},
        {p + "input_layernorm.weight", {H}, kA, true, kA},
        {p + "post_attention_layernorm.weight", {H}, kA, true, kA},
    };
    params.insert(params.end(), layer_params.begin(), layer_params.end());
  }
  params.push_back({"model.norm.weight", {H}, kA, true, kA});
  params.push_back({"lm_head.weight", {V, H}, kA, false, kA});
  return params;
}

NamedParams make_params(const std::vector<Expected>& expected,
                        at::ScalarType dtype = at::kBFloat16) {
  NamedParams params;
  for (const auto& e : expected) {
    params.emplace_back(e.name,
                        at::empty(e.shape, at::TensorOptions().dtype(dtype)).requires_grad_(true));
  }
  return params;
}

OptimizerConfig yaml_muon_config() {
  OptimizerConfig config;
  config.target = "Muon";
  config.routing = "yaml";
  config.options.get<torch::optim::AdamWOptions>().lr(1e-3);
  config.options.get<torch::optim::AdamWOptions>().weight_decay(0.01);
  config.options.get<MuonConfig>().options.lr(0.02);
  config.options.get<MuonConfig>().options.weight_decay(0.1);
  return config;
}

// What the TOML front end produces: one shared weight_decay in both fields.
OptimizerConfig toml_muon_config() {
  OptimizerConfig config = yaml_muon_config();
  config.routing = "toml";
  config.options.get<torch::optim::AdamWOptions>().weight_decay(0.05);
  config.options.get<MuonConfig>().options.weight_decay(0.05);
  config.options.get<MuonConfig>().options.lr(0.003);
  return config;
}

TEST(Routing, YamlRuleOnTinyQwen2Moe) {
  const auto expected = qwen2_moe_expectations();
  const OptimizerConfig config = yaml_muon_config();
  const auto routes = route_parameters(make_params(expected), config);
  ASSERT_EQ(routes.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(routes[i].name, expected[i].name);
    EXPECT_EQ(routes[i].shape, expected[i].shape);
    EXPECT_EQ(routes[i].dtype, at::kBFloat16);
    EXPECT_EQ(routes[i].optimizer, expected[i].yaml);
    if (expected[i].yaml == kM) {
      EXPECT_EQ(routes[i].lr, 0.02);
      EXPECT_EQ(routes[i].weight_decay, 0.1);
    } else {
      EXPECT_EQ(routes[i].lr, 1e-3);
      EXPECT_EQ(routes[i].weight_decay, expected[i].yaml_no_decay ? 0.0 : 0.01);
    }
  }
}

TEST(Routing, TomlRuleOnTinyQwen2MoeAppliesTheSharedDecayEverywhere) {
  const auto expected = qwen2_moe_expectations();
  const auto routes = route_parameters(make_params(expected), toml_muon_config());
  ASSERT_EQ(routes.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(routes[i].optimizer, expected[i].toml);
    EXPECT_EQ(routes[i].lr, expected[i].toml == kM ? 0.003 : 1e-3);
    EXPECT_EQ(routes[i].weight_decay, 0.05);  // biases and norms too, as torchtitan does
  }
}

// Names on which the two dialects disagree (torchtitan-style names and odd ranks).
TEST(Routing, DialectsDifferOnOutputNamesAndHigherRanks) {
  const std::vector<Expected> expected = {
      {"tok_embeddings.weight", {16, 8}, kA, false, kA},
      {"output.weight", {16, 8}, kM, false, kA},  // only toml excludes "output"
      {"layers.0.attention.wo.weight", {8, 8}, kM, false, kM},
      {"vision.patch_conv.weight", {4, 3, 2, 2}, kM, false, kA},  // 4-D: toml leaves to AdamW
      {"decoder.out_head.weight", {16, 8}, kA, false, kM},        // only yaml excludes out_head
      {"attn.out_proj.bias", {8}, kA, true, kA},
      {"LM_Head.weight", {16, 8}, kA, false, kA},  // names are compared lower-cased
  };
  const auto params = make_params(expected, at::kFloat);
  const auto yaml = route_parameters(params, yaml_muon_config());
  const auto toml = route_parameters(params, toml_muon_config());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(yaml[i].optimizer, expected[i].yaml);
    EXPECT_EQ(toml[i].optimizer, expected[i].toml);
  }
}

TEST(Routing, UserKeywordsSendMatchingNamesToAdamWCaseInsensitively) {
  OptimizerConfig config = yaml_muon_config();
  config.options.get<MuonConfig>().adamw_keywords = {"Shared_Expert_Gate", "mlp.gate."};
  const auto routes = route_parameters(make_params(qwen2_moe_expectations()), config);
  int keyword_routed = 0;
  for (const auto& route : routes) {
    const bool keyword = route.name.find("shared_expert_gate") != std::string::npos ||
                         route.name.find("mlp.gate.") != std::string::npos;
    if (!keyword) continue;
    SCOPED_TRACE(route.name);
    ++keyword_routed;
    EXPECT_EQ(route.optimizer, kA);
    EXPECT_EQ(route.weight_decay, 0.01);  // not a bias/norm name: AdamW's decay
  }
  EXPECT_EQ(keyword_routed, 4);  // two per layer
  // The experts' "gate_proj" does not contain "mlp.gate.": still Muon.
  for (const auto& route : routes) {
    if (route.name.find("experts.gate_proj") != std::string::npos) {
      EXPECT_EQ(route.optimizer, kM);
    }
  }

  OptimizerConfig toml = toml_muon_config();
  toml.options.get<MuonConfig>().adamw_keywords = {"experts"};
  for (const auto& route : route_parameters(make_params(qwen2_moe_expectations()), toml)) {
    if (route.name.find("experts") != std::string::npos) {
      EXPECT_EQ(route.optimizer, kA);
    }
  }
}

TEST(Routing, AdamWTargetRoutesEverythingToAdamW) {
  OptimizerConfig config = yaml_muon_config();
  config.target = "AdamW";
  const auto expected = qwen2_moe_expectations();
  const auto routes = route_parameters(make_params(expected), config);
  ASSERT_EQ(routes.size(), expected.size());
  for (size_t i = 0; i < routes.size(); ++i) {
    SCOPED_TRACE(routes[i].name);
    EXPECT_EQ(routes[i].optimizer, kA);
    EXPECT_EQ(routes[i].weight_decay, expected[i].yaml_no_decay ? 0.0 : 0.01);
  }
}

TEST(Routing, FrozenParametersAreNotRouted) {
  NamedParams params = {{"a.weight", at::zeros({2, 2}).requires_grad_()},
                        {"frozen.weight", at::zeros({2, 2})},
                        {"b.bias", at::zeros({2}).requires_grad_()}};
  const auto routes = route_parameters(params, yaml_muon_config());
  ASSERT_EQ(routes.size(), 2u);
  EXPECT_EQ(routes[0].name, "a.weight");
  EXPECT_EQ(routes[1].name, "b.bias");
}

TEST(Routing, MuonTargetThatRoutesNothingToMuonIsAConfigError) {
  NamedParams params = {{"model.embed_tokens.weight", at::zeros({8, 4}).requires_grad_()},
                        {"model.norm.weight", at::zeros({4}).requires_grad_()},
                        {"lm_head.weight", at::zeros({8, 4}).requires_grad_()}};
  for (const OptimizerConfig& config : {yaml_muon_config(), toml_muon_config()}) {
    try {
      route_parameters(params, config);
      FAIL() << "expected ConfigError for routing " << config.routing;
    } catch (const ConfigError& error) {
      EXPECT_NE(std::string(error.what()).find("optimizer._target_"), std::string::npos)
          << error.what();
      EXPECT_EQ(error.key(), "optimizer._target_");
      EXPECT_EQ(error.problem().rfind("Muon, but no trainable parameter is routed to Muon", 0), 0u)
          << error.problem();
    }
  }
}

TEST(Routing, UnknownTargetOrDialectIsAConfigError) {
  NamedParams params = {{"w", at::zeros({2, 2}).requires_grad_()}};
  OptimizerConfig config = yaml_muon_config();
  config.target = "Lion";
  EXPECT_THROW(route_parameters(params, config), ConfigError);
  config = yaml_muon_config();
  config.routing = "json";
  EXPECT_THROW(route_parameters(params, config), ConfigError);
}

std::vector<std::string> split_columns(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> columns;
  // The shape column contains ", " separators: rejoin tokens between '[' and ']'.
  std::string token, pending;
  while (in >> token) {
    if (!pending.empty()) {
      pending += " " + token;
      if (token.back() == ']') columns.push_back(pending), pending.clear();
    } else if (token.front() == '[' && token.back() != ']') {
      pending = token;
    } else {
      columns.push_back(token);
    }
  }
  return columns;
}

TEST(Routing, TableHasOneAlignedRowPerParameter) {
  const auto expected = qwen2_moe_expectations();
  const auto routes = route_parameters(make_params(expected), yaml_muon_config());
  const std::string table = format_routing_table(routes);
  std::vector<std::string> lines;
  std::istringstream in(table);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), expected.size() + 1);
  EXPECT_EQ(split_columns(lines[0]), (std::vector<std::string>{"name", "shape", "dtype",
                                                               "optimizer", "lr", "weight_decay"}));
  // Row of the first layer's expert gate_proj: index 1 + 1 (embed) + 8.
  EXPECT_EQ(split_columns(lines[1 + 1 + 8]),
            (std::vector<std::string>{"model.layers.0.mlp.experts.gate_proj", "[4, 32, 64]",
                                      "bfloat16", "muon", "0.02", "0.1"}));
  EXPECT_EQ(split_columns(lines[1 + 2]),
            (std::vector<std::string>{"model.layers.0.self_attn.q_proj.bias", "[64]", "bfloat16",
                                      "adamw", "0.001", "0"}));
  // Aligned: every column starts at the same offset in every line.
  const size_t dtype_column = lines[0].find("dtype");
  const size_t lr_column = lines[0].find(" lr ") + 1;
  for (size_t i = 1; i < lines.size(); ++i) {
    SCOPED_TRACE(lines[i]);
    EXPECT_EQ(lines[i].find("bfloat16"), dtype_column);
    EXPECT_TRUE(lines[i].compare(lr_column, 4, "0.02") == 0 ||
                lines[i].compare(lr_column, 5, "0.001") == 0);
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
