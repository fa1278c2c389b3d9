// DeepSeek-V3 (model/deepseek_v3.h): the router and the sequence-wise balance loss against
// computations written here element by element; the balancing bias update and what counts as
// load; names, shapes and roles; validation; and logits, loss and every gradient against
// transformers' DeepseekV3ForCausalLM (support/hf_parity.h) with and without query compression,
// with group-limited routing, a dense first layer, both rotary layouts, attention biases and
// tied embeddings.
#include "mixtrain/model/deepseek_v3.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "mixtrain/core/safetensors.h"
#include "mixtrain/model/deepseek_v3_config.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/registry.h"
#include "support/hf_parity.h"
#include "support/tiny_model_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using deepseek_v3::route_grouped_sigmoid;
using deepseek_v3::Routing;
using deepseek_v3::sequence_balance_loss;
using test_support::tiny_deepseek_v3;

// A fresh directory for the router oracle's files, removed at the end.
struct ScopedTempDirForRouter {
  ScopedTempDirForRouter() : dir("deepseek_router."), path(dir.path().string()) {}
  test_support::ScopedTempDir dir;
  std::string path;
};

// The router of the header, one token at a time with std::sort (float64 selection; float32
// inputs, so no ties at these magnitudes).
struct TokenChoice {
  std::vector<int64_t> experts;
  std::vector<double> weights;
};
TokenChoice route_by_hand(const std::vector<double>& logits, const std::vector<double>& bias,
                          int64_t k, int64_t groups, int64_t keep_groups, bool norm,
                          double scaling) {
  const int64_t experts = static_cast<int64_t>(logits.size()), per = experts / groups;
  std::vector<double> s(experts), choice(experts);
  for (int64_t e = 0; e < experts; ++e) {
    s[e] = 1.0 / (1.0 + std::exp(-logits[e]));
    choice[e] = s[e] + bias[e];
  }
  std::vector<std::pair<double, int64_t>> group_scores;
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<double> member(choice.begin() + g * per, choice.begin() + (g + 1) * per);
    std::sort(member.rbegin(), member.rend());
    group_scores.push_back({member[0] + member[1], g});
  }
  std::sort(group_scores.rbegin(), group_scores.rend());
  std::vector<std::pair<double, int64_t>> candidates;
  for (int64_t i = 0; i < keep_groups; ++i) {
    const int64_t g = group_scores[i].second;
    for (int64_t e = g * per; e < (g + 1) * per; ++e) candidates.push_back({choice[e], e});
  }
  std::sort(candidates.rbegin(), candidates.rend());
  TokenChoice out;
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    out.experts.push_back(candidates[i].second);
    out.weights.push_back(s[candidates[i].second]);
    sum += s[candidates[i].second];
  }
  for (double& w : out.weights) w = (norm ? w / (sum + 1e-20) : w) * scaling;
  return out;
}

TEST(DeepseekV3Router, GroupLimitedSigmoidChoicesAndWeightsMatchAHandComputation) {
  torch::manual_seed(3);
  const int64_t tokens = 29, experts = 12;
  const auto logits = torch::randn({tokens, experts}) * 2.0;
  const auto bias = torch::randn({experts}) * 0.3;
  for (const auto& [groups, keep, k, norm] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>{
           {1, 1, 3, true}, {4, 2, 3, true}, {3, 1, 2, false}, {6, 3, 4, true}}) {
    const Routing r = route_grouped_sigmoid(logits, bias, k, groups, keep, norm, 2.5);
    ASSERT_EQ(r.indices.sizes(), (std::vector<int64_t>{tokens, k}));
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> l(experts), b(experts);
      for (int64_t e = 0; e < experts; ++e) {
        l[e] = logits[t][e].item<double>();
        b[e] = bias[e].item<double>();
      }
      const TokenChoice want = route_by_hand(l, b, k, groups, keep, norm, 2.5);
      std::map<int64_t, double> got;
      for (int64_t i = 0; i < k; ++i) {
        got[r.indices[t][i].item<int64_t>()] = r.weights[t][i].item<double>();
      }
      ASSERT_EQ(got.size(), static_cast<size_t>(k)) << "token " << t << ": repeated expert";
      for (int64_t i = 0; i < k; ++i) {
        ASSERT_EQ(got.count(want.experts[i]), 1u)
            << "groups " << groups << " keep " << keep << " token " << t << " expert "
            << want.experts[i] << " not chosen";
        // float32 sigmoid and sum against float64: a few float32 ulps of values <= 2.5.
        EXPECT_NEAR(got[want.experts[i]], want.weights[i], 2e-6);
      }
    }
    // The weights are the sigmoid scores, not the biased selection scores.
    EXPECT_TRUE(torch::allclose(r.scores, logits.sigmoid()));
  }
}

// Against transformers' DeepseekV3TopkRouter itself, four settings (one group; 4 groups keeping
// 2; 6 keeping 3 without renormalising; 3 keeping 1), on the same float32 inputs with a random
// selection bias. The oracle refuses near-ties (1e-4), so the chosen sets are exact (HF's topk
// is unsorted: compared as sets, each expert with its weight); the weights are float32 sigmoids
// of the same float32 logits (up to GEMM summation order, ~1e-7 relative): 1e-6.
TEST(DeepseekV3Router, ChoicesAndWeightsMatchTransformers) {
  const ScopedTempDirForRouter dir;
  const std::map<std::string, std::tuple<int64_t, int64_t, bool, double>> settings = {
      {"one_group", {1, 1, true, 2.5}},
      {"four_keep_two", {4, 2, true, 1.0}},
      {"six_keep_three", {6, 3, false, 2.446}},
      {"three_keep_one", {3, 1, true, 1.0}}};
  const int64_t top_k = 3;
  {
    std::ofstream json(dir.path + "/case.json");
    json << "{\"seed\": 5, \"tokens\": 40, \"hidden\": 24, \"experts\": 12, \"top_k\": " << top_k
         << ", \"settings\": {";
    bool first = true;
    for (const auto& [name, s] : settings) {
      json << (first ? "" : ", ") << "\"" << name << "\": [" << std::get<0>(s) << ", "
           << std::get<1>(s) << ", " << (std::get<2>(s) ? "true" : "false") << ", "
           << std::get<3>(s) << "]";
      first = false;
    }
    json << "}}\n";
  }
  ASSERT_TRUE(test_support::python_script_succeeds(
      {"hf_parity.py", "deepseek_router", dir.path + "/case.json", dir.path}));
  std::map<std::string, torch::Tensor> hf;
  for (const auto& [name, t] : read_safetensors(dir.path + "/router.safetensors").tensors) {
    hf[name] = t;
  }
  const auto logits = at::linear(hf.at("hidden"), hf.at("weight"));
  for (const auto& [name, s] : settings) {
    const auto [groups, keep, norm, scaling] = s;
    const Routing r =
        route_grouped_sigmoid(logits, hf.at("bias"), top_k, groups, keep, norm, scaling);
    const auto& theirs = hf.at(name + ".indices");
    const auto& their_weights = hf.at(name + ".weights");
    for (int64_t t = 0; t < logits.size(0); ++t) {
      std::map<int64_t, double> ours, hf_choice;
      for (int64_t i = 0; i < top_k; ++i) {
        ours[r.indices[t][i].item<int64_t>()] = r.weights[t][i].item<double>();
        hf_choice[theirs[t][i].item<int64_t>()] = their_weights[t][i].item<double>();
      }
      ASSERT_EQ(ours.size(), hf_choice.size()) << name << " token " << t;
      for (const auto& [expert, weight] : hf_choice) {
        ASSERT_EQ(ours.count(expert), 1u) << name << " token " << t << " expert " << expert;
        EXPECT_NEAR(ours.at(expert), weight, 1e-6 * std::abs(weight) + 1e-7) << name;
      }
    }
  }
}

TEST(DeepseekV3Router, TheBiasChangesTheChoiceButNotTheWeights) {
  const auto logits = torch::tensor({{0.0f, 0.1f, 0.2f, 0.3f}});
  const auto none = route_grouped_sigmoid(logits, torch::zeros({4}), 1, 1, 1, false, 1.0);
  EXPECT_EQ(none.indices.item<int64_t>(), 3);
  const auto biased =
      route_grouped_sigmoid(logits, torch::tensor({1.0f, 0.f, 0.f, 0.f}), 1, 1, 1, false, 1.0);
  EXPECT_EQ(biased.indices.item<int64_t>(), 0);
  EXPECT_FLOAT_EQ(biased.weights.item<float>(), 0.5f);  // sigmoid(0), not 1.5
}

// Report eq. 17-20, written per sequence with loops.
double balance_loss_by_hand(const torch::Tensor& scores, const torch::Tensor& indices,
                            int64_t batch) {
  const int64_t experts = scores.size(1), k = indices.size(1), len = scores.size(0) / batch;
  double total = 0;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<double> f(experts, 0.0), p(experts, 0.0);
    for (int64_t t = b * len; t < (b + 1) * len; ++t) {
      double sum = 0;
      for (int64_t e = 0; e < experts; ++e) sum += scores[t][e].item<double>();
      for (int64_t e = 0; e < experts; ++e) p[e] += scores[t][e].item<double>() / sum / len;
      for (int64_t i = 0; i < k; ++i) {
        f[indices[t][i].item<int64_t>()] += double(experts) / double(k * len);
      }
    }
    for (int64_t e = 0; e < experts; ++e) total += f[e] * p[e];
  }
  return total / batch;
}

TEST(DeepseekV3BalanceLoss, MatchesTheReportPerSequence) {
  torch::manual_seed(5);
  const int64_t batch = 3, len = 7, experts = 6;
  const auto scores = torch::rand({batch * len, experts}) * 0.9 + 0.05;
  const auto indices = std::get<1>(torch::rand({batch * len, experts}).topk(2, -1));
  const double got = sequence_balance_loss(scores, indices, batch).item<double>();
  EXPECT_NEAR(got, balance_loss_by_hand(scores, indices, batch), 1e-6 * got);
  // Uniform scores and perfectly balanced choices give exactly 1.
  const auto uniform = torch::full({6, 3}, 0.4f);
  const auto balanced = torch::tensor({0, 1, 2, 0, 1, 2}, torch::kLong).view({6, 1});
  EXPECT_NEAR(sequence_balance_loss(uniform, balanced, 2).item<double>(), 1.0, 1e-6);
}

TEST(DeepseekV3, ParameterNamesShapesAndRolesFollowHuggingFace) {
  auto model = build_model(tiny_deepseek_v3(), 1);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : model->named_parameters())
    shapes[item.key()] = item.value().sizes().vec();
  const std::string a = "model.layers.1.self_attn.";
  EXPECT_EQ(shapes.at(a + "q_a_proj.weight"), (std::vector<int64_t>{9, 24}));
  EXPECT_EQ(shapes.at(a + "q_a_layernorm.weight"), (std::vector<int64_t>{9}));
  EXPECT_EQ(shapes.at(a + "q_b_proj.weight"), (std::vector<int64_t>{3 * 16, 9}));
  EXPECT_EQ(shapes.at(a + "kv_a_proj_with_mqa.weight"), (std::vector<int64_t>{11 + 6, 24}));
  EXPECT_EQ(shapes.at(a + "kv_a_layernorm.weight"), (std::vector<int64_t>{11}));
  EXPECT_EQ(shapes.at(a + "kv_b_proj.weight"), (std::vector<int64_t>{3 * 17, 11}));
  EXPECT_EQ(shapes.at(a + "o_proj.weight"), (std::vector<int64_t>{24, 21}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{19, 24}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.gate.weight"), (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.experts.gate_proj"), (std::vector<int64_t>{8, 5, 24}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.experts.down_proj"), (std::vector<int64_t>{8, 24, 5}));
  EXPECT_EQ(shapes.at("model.layers.2.mlp.shared_experts.up_proj.weight"),
            (std::vector<int64_t>{10, 24}));
  EXPECT_EQ(shapes.count("model.layers.1.self_attn.q_proj.weight"), 0u);
  EXPECT_EQ(shapes.count("model.layers.0.mlp.gate.weight"), 0u);
  EXPECT_EQ(model->param_role(a + "q_a_proj.weight"), ParamRole::kAttentionLatent);
  EXPECT_EQ(model->param_role(a + "kv_a_proj_with_mqa.weight"), ParamRole::kAttentionLatent);
  EXPECT_EQ(model->param_role(a + "q_b_proj.weight"), ParamRole::kAttentionQuery);
  EXPECT_EQ(model->param_role(a + "kv_b_proj.weight"), ParamRole::kAttentionKeyValue);
  EXPECT_EQ(model->param_role(a + "o_proj.weight"), ParamRole::kAttentionOutput);
  EXPECT_EQ(model->param_role(a + "kv_a_layernorm.weight"), ParamRole::kNorm);
  // Per-head layouts (Muon's per-head blocks, MuonClip's factors): the query 10 content + 6
  // rotary rows per head, kv_b_proj 10 key + 7 value rows, o_proj 7 columns.
  const auto layout = [&](const std::string& name) { return model->param_roles().at(name).heads; };
  EXPECT_EQ(layout(a + "q_b_proj.weight").block, 16);
  EXPECT_EQ(layout(a + "q_b_proj.weight").content, 10);
  EXPECT_EQ(layout(a + "q_b_proj.weight").rotary, 6);
  EXPECT_EQ(layout(a + "kv_b_proj.weight").block, 17);
  EXPECT_EQ(layout(a + "kv_b_proj.weight").content, 10);
  EXPECT_EQ(layout(a + "kv_b_proj.weight").rotary, 0);
  EXPECT_EQ(layout(a + "o_proj.weight").block, 7);
  EXPECT_EQ(layout(a + "q_a_proj.weight").block, 0);
  EXPECT_EQ(model->param_role("model.layers.1.mlp.gate.weight"), ParamRole::kRouter);
  EXPECT_EQ(model->param_role("model.layers.1.mlp.experts.up_proj"), ParamRole::kExpert);
  EXPECT_EQ(model->param_role("model.layers.1.mlp.shared_experts.up_proj.weight"), ParamRole::kMlp);
  EXPECT_EQ(model->param_role("model.layers.0.mlp.up_proj.weight"), ParamRole::kMlp);
  // The selection biases: model state of the MoE layers only, float32 zeros, not parameters.
  const auto state = model->model_state();
  ASSERT_EQ(state.size(), 2u);
  for (const auto& [name, bias] : state) {
    EXPECT_EQ(shapes.count(name), 0u) << name;
    EXPECT_EQ(bias.scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(bias, torch::zeros({8})));
  }
  EXPECT_EQ(state.count("model.layers.1.mlp.gate.e_score_correction_bias"), 1u);
  auto plain = build_model(tiny_deepseek_v3(/*q_lora_rank=*/0), 1);
  EXPECT_EQ(plain->named_parameters().find(a + "q_proj.weight")->sizes(),
            (std::vector<int64_t>{3 * 16, 24}));
}

// Counts only while collecting, once per routed (token, slot) even when the layer is recomputed
// in backward; the update moves each bias by speed in the direction of the mean load, using the
// sums the caller provides; the counts start anew.
TEST(DeepseekV3, BalancingBiasFollowsTheSummedLoadsAndCountsEachTokenOnce) {
  auto c = tiny_deepseek_v3();
  deepseek_v3_config(c).bias_update_speed = 0.125;
  const auto ids = torch::randint(37, {2, 9});
  std::map<std::string, torch::Tensor> loads_seen;
  for (const int64_t recompute : {0, 1}) {
    auto model = build_model(c, 7);
    model->set_activation_checkpointing(recompute);
    model->forward(ids);  // not collecting: no load
    model->set_collect_state_statistics(true);
    model->forward(ids).logits.sum().backward();
    model->set_collect_state_statistics(false);
    std::vector<torch::Tensor> summed;
    model->update_model_state([&](torch::Tensor& loads) {
      summed.push_back(loads.clone());
      loads.mul_(3.0);  // as if three ranks had seen the same tokens
    });
    ASSERT_EQ(summed.size(), 1u);
    const auto loads = summed[0];
    ASSERT_EQ(loads.sizes(), (std::vector<int64_t>{2, 8}));
    // Every token chose 3 experts in each MoE layer, counted once.
    EXPECT_TRUE(torch::equal(loads.sum(1), torch::full({2}, 2.0 * 9 * 3)));
    size_t layer = 0;
    for (const auto& [name, bias] : model->model_state()) {
      const auto l = loads[static_cast<int64_t>(layer++)] * 3.0;
      EXPECT_TRUE(torch::equal(bias, torch::sign(l.mean() - l) * 0.125)) << name;
    }
    loads_seen[std::to_string(recompute)] = loads;
    // Counts were cleared: the next update changes nothing unless forwards collect again.
    const auto before = model->model_state().begin()->second.clone();
    model->update_model_state(
        [](torch::Tensor& loads) { EXPECT_EQ(loads.sum().item<double>(), 0); });
    EXPECT_TRUE(torch::equal(model->model_state().begin()->second, before));
  }
  EXPECT_TRUE(torch::equal(loads_seen["0"], loads_seen["1"]));
}

// The update on data-parallel replicas (HSDP: each replica's forwards see other tokens): replica
// B's loads come in through sum_over_data, as the trainer's all-reduce over dp_replicate brings
// them (trainer/model_state_hook.cpp), and each bias moves by speed * sign(mean - load) of the
// summed loads. B's batch repeats one token, so all its rows pile onto the same experts: the
// summed loads give other signs than replica A's own for some experts (checked below; 11 of the
// 16 here), so an update that used A's loads alone fails (checked: the test fails when
// deepseek_v3.cpp updates each bias from its router's own loads instead of the summed ones,
// which the test above passes: its sum is 3x the loads, whose signs are the loads' own).
TEST(DeepseekV3, BalancingBiasUpdateUsesTheLoadsSummedOverReplicas) {
  auto c = tiny_deepseek_v3();
  deepseek_v3_config(c).bias_update_speed = 0.125;
  torch::manual_seed(3);
  const auto ids_a = torch::randint(37, {2, 9});
  const auto ids_b = torch::full({2, 9}, 5, torch::kInt64);
  // Each replica's own loads (the model of B: the same weights, its own batch).
  const auto loads_of = [&](const torch::Tensor& ids) {
    auto model = build_model(c, 7);
    model->set_collect_state_statistics(true);
    model->forward(ids).logits.sum().backward();
    torch::Tensor loads;
    model->update_model_state([&](torch::Tensor& l) { loads = l.clone(); });
    return loads;
  };
  const torch::Tensor loads_b = loads_of(ids_b);
  auto model = build_model(c, 7);
  model->set_collect_state_statistics(true);
  model->forward(ids_a).logits.sum().backward();
  torch::Tensor loads_a;
  model->update_model_state([&](torch::Tensor& loads) {
    loads_a = loads.clone();
    loads.add_(loads_b);  // the other replica's counts, as the all-reduce adds them
  });
  ASSERT_TRUE(loads_a.defined());
  ASSERT_EQ(loads_a.sizes(), (std::vector<int64_t>{2, 8}));
  int64_t flipped = 0;
  int64_t layer = 0;
  for (const auto& [name, bias] : model->model_state()) {
    const auto summed = loads_a[layer] + loads_b[layer];
    const auto own = loads_a[layer];
    ++layer;
    const auto want = torch::sign(summed.mean() - summed) * 0.125;
    EXPECT_TRUE(torch::equal(bias, want)) << name << ": " << bias << " want " << want;
    flipped +=
        torch::sign(own.mean() - own).ne(torch::sign(summed.mean() - summed)).sum().item<int64_t>();
  }
  EXPECT_EQ(layer, 2);
  std::cout << flipped << " of 16 experts' bias updates take another sign from the summed loads\n";
  EXPECT_GT(flipped, 0) << "one replica's loads give the summed loads' signs: the case cannot tell";
}

TEST(DeepseekV3, SetModelStateRestoresAndRefusesStrangers) {
  auto model = build_model(tiny_deepseek_v3(), 1);
  const std::string name = "model.layers.2.mlp.gate.e_score_correction_bias";
  model->set_model_state(name, torch::arange(8, torch::kFloat64));
  EXPECT_TRUE(torch::equal(model->model_state().at(name), torch::arange(8, torch::kFloat32)));
  EXPECT_THROW(
      model->set_model_state("model.layers.0.mlp.gate.e_score_correction_bias", torch::zeros({8})),
      std::invalid_argument);
  EXPECT_ANY_THROW(model->set_model_state(name, torch::zeros({7})));
}

TEST(DeepseekV3, AuxLossIsTheBalanceLossOfEveryMoeLayerAndReachesTheRouter) {
  auto c = tiny_deepseek_v3();
  auto off = build_model(c, 3);
  EXPECT_EQ(off->forward(torch::randint(37, {2, 5})).aux_loss.item<double>(), 0.0);
  moe_config(c).router_aux_loss_coef = 0.01;
  auto model = build_model(c, 3);
  const auto out = model->forward(torch::randint(37, {2, 5}));
  // Two MoE layers, each >= ~1 (1 when balanced).
  EXPECT_GT(out.aux_loss.item<double>(), 1.0);
  out.aux_loss.backward();
  const auto& router = model->named_parameters()["model.layers.1.mlp.gate.weight"];
  ASSERT_TRUE(router.grad().defined());
  EXPECT_GT(router.grad().abs().sum().item<double>(), 0.0);
}

TEST(DeepseekV3, RefusesShapesItCannotBuild) {
  const auto refused = [](const std::function<void(ModelConfig&)>& change, const char* key) {
    auto c = tiny_deepseek_v3();
    change(c);
    try {
      build_model(c, 1);
      ADD_FAILURE() << key << ": built";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  refused([](ModelConfig& c) { c.num_kv_heads = 1; }, "num_kv_heads");
  refused([](ModelConfig& c) { c.head_dim = 8; }, "head_dim");
  refused([](ModelConfig& c) { deepseek_v3_config(c).n_group = 3; }, "n_group");
  refused([](ModelConfig& c) { deepseek_v3_config(c).n_group = 8; }, "n_group");
  refused([](ModelConfig& c) { deepseek_v3_config(c).topk_group = 5; }, "topk_group");
  refused([](ModelConfig& c) { moe_config(c).num_experts_per_tok = 5; }, "num_experts_per_tok");
  refused([](ModelConfig& c) { deepseek_v3_config(c).first_k_dense_replace = 4; },
          "first_k_dense_replace");
}

// Tolerances: support/hf_parity.h (float32 against HF's float64 on float32-exact weights). The
// oracle draws the selection biases N(0, 0.1^2) so they change choices, and refuses a case whose
// group or expert choice is within 1e-4 of a tie.
TEST(DeepseekV3, LogitsLossAndGradientsMatchTransformers) {
  const auto r = test_support::run_hf_parity(tiny_deepseek_v3(), 31, 2, 13);
  if (HasFailure()) return;
  test_support::expect_hf_parity(r, "deepseek_v3 (q_lora_rank 9, 4 groups, 1 dense layer)");
}

TEST(DeepseekV3, WithoutQueryCompressionPlainRotaryBiasesAndTiedEmbeddings) {
  auto c = tiny_deepseek_v3(/*q_lora_rank=*/0);
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  auto& d = deepseek_v3_config(c);
  d.rope_interleave = false;
  d.n_group = 1;
  d.topk_group = 1;
  d.first_k_dense_replace = 0;
  d.routed_scaling_factor = 1.0;
  moe_config(c).norm_topk_prob = false;
  const auto r = test_support::run_hf_parity(c, 32, 2, 11);
  if (HasFailure()) return;
  test_support::expect_hf_parity(r, "deepseek_v3 (q_proj, rotate_half, biases, tied)");
}

// YaRN as DeepSeek-V3 uses it (mscale = mscale_all_dim: the tables' attention factor is 1, the
// softmax scale times m(factor, mscale_all_dim)^2 = 1.139^2 here), with the original context
// shrunk to 4 so the 13-position sequence reaches the interpolated dims (the oracle fails unless
// dropping the scaling moves the logits by >= 1e-2 of their scale). Tolerances as above.
TEST(DeepseekV3, YarnRotaryAndSoftmaxScaleMatchTransformers) {
  auto c = tiny_deepseek_v3();
  c.rope_scaling = "yarn";
  c.rope_scaling_factor = 4.0;
  c.rope_original_max_seq_len = 4;
  c.rope_yarn_mscale = 1.0;
  c.rope_yarn_mscale_all_dim = 1.0;
  const auto r = test_support::run_hf_parity(c, 33, 2, 13);
  if (HasFailure()) return;
  test_support::expect_hf_parity(r, "deepseek_v3 (yarn, mscale_all_dim 1)");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
