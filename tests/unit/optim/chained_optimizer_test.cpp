#include "mixtrain/optim/chained_optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <torch/arg.h>
#include "support/test_sgd.h"

#include <map>
#include <stdexcept>

#include "mixtrain/optim/adamw.h"
#include "mixtrain/optim/muon.h"

namespace mixtrain {
namespace {

using test_doubles::make_sgd;
using test_doubles::TestSgd;

at::Tensor param(std::vector<float> values, std::vector<int64_t> shape) {
  return at::tensor(values).reshape(shape).requires_grad_(true);
}

// Two leaves: "a" = {w [2, 3]} lr 0.1; "b" = {bias [3]} lr 0.5, wd 0.1 in a second leaf.
struct TwoLeaves {
  at::Tensor w = param({1, 2, 3, 4, 5, 6}, {2, 3});
  at::Tensor bias = param({0.5f, -0.5f, 1.0f}, {3});
  ChainedOptimizer chain;
  TestSgd* a = nullptr;
  TestSgd* b = nullptr;
  TwoLeaves() {
    auto leaf_a = make_sgd({w}, 0.1);
    auto leaf_b = make_sgd({bias}, 0.5, 0.1);
    a = leaf_a.get();
    b = leaf_b.get();
    chain.add_leaf(std::move(leaf_a), {{"layer.w", w}});
    chain.add_leaf(std::move(leaf_b), {{"layer.bias", bias}});
  }
};

void expect_values(const at::Tensor& actual, const std::vector<double>& expected) {
  // float32 arithmetic against double: a few float32 ulps (relative 1e-6) at these magnitudes.
  at::Tensor flat = actual.detach().to(at::kDouble).reshape({-1});
  ASSERT_EQ(flat.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(flat[i].item<double>(), expected[i], 1e-6 * (1 + std::abs(expected[i])))
        << "element " << i;
  }
}

TEST(ChainedOptimizer, StepsEveryLeafAndZeroGradClearsGrads) {
  TwoLeaves t;
  t.w.mutable_grad() = at::full({2, 3}, 1.0f);
  t.bias.mutable_grad() = at::tensor({1.0f, 2.0f, -1.0f});
  EXPECT_TRUE(t.chain.step());
  // Step 1 (buf = g): w - 0.1 * 1; bias * (1 - 0.5 * 0.1) - 0.5 * g.
  expect_values(t.w, {0.9, 1.9, 2.9, 3.9, 4.9, 5.9});
  expect_values(t.bias, {0.5 * 0.95 - 0.5, -0.5 * 0.95 - 1.0, 1.0 * 0.95 + 0.5});
  t.chain.zero_grad();
  EXPECT_FALSE(t.w.grad().defined());
  EXPECT_FALSE(t.bias.grad().defined());

  t.w.mutable_grad() = at::full({2, 3}, 2.0f);
  t.chain.step();
  // Step 2: buf = 0.5 * 1 + 2 = 2.5; w -= 0.25. bias has no grad: unchanged.
  expect_values(t.w, {0.65, 1.65, 2.65, 3.65, 4.65, 5.65});
  expect_values(t.bias, {0.5 * 0.95 - 0.5, -0.5 * 0.95 - 1.0, 1.0 * 0.95 + 0.5});
}

TEST(ChainedOptimizer, MapsNamesAndParameters) {
  TwoLeaves t;
  EXPECT_EQ(t.chain.names(), (std::vector<std::string>{"layer.w", "layer.bias"}));
  EXPECT_TRUE(t.chain.model_param("layer.w").is_same(t.w));
  EXPECT_TRUE(t.chain.optimizer_param("layer.w").is_same(t.w));
  EXPECT_EQ(t.chain.name_of(t.bias), "layer.bias");
  EXPECT_EQ(&t.chain.leaf_of("layer.bias"), t.b);
  EXPECT_EQ(t.chain.leaves().size(), 2u);
  EXPECT_THROW(t.chain.model_param("nope"), std::invalid_argument);
  EXPECT_THROW(t.chain.name_of(at::zeros({1})), std::invalid_argument);
  EXPECT_TRUE(t.chain.contains("layer.w"));
  EXPECT_FALSE(t.chain.contains("layer.x"));
}

TEST(ChainedOptimizer, AddLeafRejectsUnnamedDuplicateOrForeignParameters) {
  at::Tensor x = param({1, 2}, {2});
  at::Tensor y = param({3, 4}, {2});
  ChainedOptimizer chain;
  EXPECT_THROW(chain.add_leaf(make_sgd({x, y}, 0.1), {{"x", x}}), std::invalid_argument);
  EXPECT_THROW(chain.add_leaf(make_sgd({x}, 0.1), {{"y", y}}), std::invalid_argument);
  chain.add_leaf(make_sgd({x}, 0.1), {{"x", x}});
  EXPECT_THROW(chain.add_leaf(make_sgd({y}, 0.1), {{"x", y}}), std::invalid_argument);
  EXPECT_THROW(chain.add_leaf(make_sgd({x}, 0.1), {{"x2", x}}), std::invalid_argument);
  EXPECT_EQ(chain.names(), std::vector<std::string>{"x"});
}

TEST(ChainedOptimizer, ReplaceParameterMovesStateAndKeepsTheModelName) {
  TwoLeaves t;
  t.w.mutable_grad() = at::ones({2, 3});
  t.chain.step();
  t.chain.zero_grad();
  at::Tensor replacement = t.w.detach().clone().requires_grad_(true);
  const at::Tensor buffer_before = t.a->export_state(t.w)[0].second.clone();

  t.chain.replace_parameter("layer.w", replacement);
  EXPECT_TRUE(t.chain.optimizer_param("layer.w").is_same(replacement));
  EXPECT_TRUE(t.chain.model_param("layer.w").is_same(t.w));
  EXPECT_EQ(t.chain.name_of(replacement), "layer.w");
  EXPECT_EQ(t.chain.name_of(t.w), "layer.w");  // the model-param side of the map
  EXPECT_TRUE(t.a->param_groups()[0].params()[0].is_same(replacement));
  EXPECT_TRUE(t.a->export_state(t.w).empty());
  ASSERT_EQ(t.a->export_state(replacement).size(), 2u);
  EXPECT_TRUE(at::equal(t.a->export_state(replacement)[0].second, buffer_before));
  EXPECT_EQ(t.a->cache_resets, 1);
  EXPECT_EQ(t.b->cache_resets, 0);

  const at::Tensor w_before = t.w.detach().clone();
  replacement.mutable_grad() = at::ones({2, 3});
  t.chain.step();
  EXPECT_TRUE(at::equal(t.w, w_before));  // the replaced tensor is no longer updated
  // buf = 0.5 * 1 + 1 = 1.5 -> 0.9 - 0.15.
  expect_values(replacement, {0.75, 1.75, 2.75, 3.75, 4.75, 5.75});
  EXPECT_THROW(t.chain.replace_parameter("layer.w", at::zeros({3})), std::invalid_argument);
}

TEST(ChainedOptimizer, MainGradIsPreferredOverGradAndClearedByZeroGrad) {
  TwoLeaves t;
  at::Tensor& main_grad = t.chain.main_grad("layer.w");
  EXPECT_EQ(main_grad.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(main_grad, at::zeros({2, 3})));
  main_grad.add_(at::full({2, 3}, 2.0f));
  t.w.mutable_grad() = at::full({2, 3}, 100.0f);
  t.bias.mutable_grad() = at::ones({3});
  t.chain.accumulate_model_grads();  // no-op for the plain chain
  EXPECT_TRUE(t.bias.grad().defined());
  t.chain.prepare_grads();
  EXPECT_TRUE(t.w.grad().is_same(t.chain.main_grad("layer.w")));  // float32: the same tensor
  EXPECT_TRUE(at::equal(t.bias.grad(), at::ones({3})));           // no main_grad: .grad stays
  EXPECT_EQ(t.chain.grads_for_clipping().size(), 2u);
  t.chain.step_with_ready_grads();
  expect_values(t.w, {0.8, 1.8, 2.8, 3.8, 4.8, 5.8});  // 2, not 100

  t.chain.zero_grad();
  EXPECT_FALSE(t.chain.main_grad_if_defined("layer.w").defined());
  EXPECT_FALSE(t.w.grad().defined());
  EXPECT_TRUE(t.chain.grads_for_clipping().empty());
  EXPECT_TRUE(at::equal(t.chain.main_grad("layer.w"), at::zeros({2, 3})));  // fresh buffer
  EXPECT_THROW(t.chain.main_grad("nope"), std::invalid_argument);
}

TEST(ChainedOptimizer, LrFactorScalesEachGroupsBuildLr) {
  TwoLeaves t;
  t.chain.set_lr_factor(0.5);
  EXPECT_DOUBLE_EQ(t.a->param_groups()[0].options().get_lr(), 0.05);
  EXPECT_DOUBLE_EQ(t.b->param_groups()[0].options().get_lr(), 0.25);
  t.chain.set_lr_factor(0.5);  // relative to the build lr, not compounded
  EXPECT_DOUBLE_EQ(t.a->param_groups()[0].options().get_lr(), 0.05);
  t.chain.set_lr_factor(1.0);
  EXPECT_DOUBLE_EQ(t.b->param_groups()[0].options().get_lr(), 0.5);
}

TEST(ChainedOptimizer, StateDictIsKeyedByModelNames) {
  TwoLeaves t;
  EXPECT_TRUE(t.chain.state_dict().empty());  // lazy state: nothing before the first step
  t.w.mutable_grad() = at::ones({2, 3});
  t.bias.mutable_grad() = at::ones({3});
  t.chain.step();
  std::vector<std::string> keys;
  for (const auto& [key, tensor] : t.chain.state_dict()) keys.push_back(key);
  EXPECT_EQ(keys,
            (std::vector<std::string>{
                "optimizer.state.layer.w.momentum_buffer", "optimizer.state.layer.w.step",
                "optimizer.state.layer.bias.momentum_buffer", "optimizer.state.layer.bias.step"}));
}

NamedTensors cloned(const NamedTensors& state) {
  NamedTensors copy;
  for (const auto& [key, tensor] : state) copy.emplace_back(key, tensor.clone());
  return copy;
}

TEST(ChainedOptimizer, LoadStateDictRestoresStateSoTheNextStepMatches) {
  TwoLeaves saved;
  for (int i = 0; i < 2; ++i) {
    saved.w.mutable_grad() = at::full({2, 3}, 1.0f + i);
    saved.bias.mutable_grad() = at::full({3}, -1.0f);
    saved.chain.step();
  }
  const NamedTensors state = cloned(saved.chain.state_dict());

  TwoLeaves restored;
  {
    at::NoGradGuard no_grad;
    restored.w.copy_(saved.w);
    restored.bias.copy_(saved.bias);
  }
  restored.chain.load_state_dict(state);
  for (auto* t : {&saved, &restored}) {
    t->w.mutable_grad() = at::full({2, 3}, 0.25f);
    t->bias.mutable_grad() = at::full({3}, 4.0f);
    t->chain.step();
  }
  EXPECT_TRUE(at::equal(saved.w, restored.w));
  EXPECT_TRUE(at::equal(saved.bias, restored.bias));
  EXPECT_EQ(restored.a->export_state(restored.w)[1].second.item<int64_t>(), 3);
}

TEST(ChainedOptimizer, InitializeStateCreatesStateWithoutTouchingParamsAndCanBeUndone) {
  TwoLeaves t;
  t.w.mutable_grad() = at::full({2, 3}, 7.0f);
  const at::Tensor grad = t.w.grad();
  const at::Tensor w_before = t.w.detach().clone();
  auto created = t.chain.initialize_state();
  EXPECT_EQ(created.names(), (std::vector<std::string>{"layer.w", "layer.bias"}));
  EXPECT_TRUE(at::equal(t.w, w_before));
  EXPECT_TRUE(t.w.grad().is_same(grad));
  EXPECT_FALSE(t.bias.grad().defined());
  EXPECT_DOUBLE_EQ(t.a->param_groups()[0].options().get_lr(), 0.1);
  EXPECT_TRUE(at::equal(t.a->export_state(t.w)[0].second, at::zeros({2, 3})));
  t.chain.undo_initialize_state(created);
  EXPECT_TRUE(t.a->export_state(t.w).empty());
  EXPECT_TRUE(t.b->export_state(t.bias).empty());
}

TEST(ChainedOptimizer, LoadStateDictChecksEverythingAndModifiesNothingOnError) {
  TwoLeaves saved;
  saved.w.mutable_grad() = at::ones({2, 3});
  saved.bias.mutable_grad() = at::ones({3});
  saved.chain.step();
  NamedTensors good = cloned(saved.chain.state_dict());

  // A fresh optimizer (no state) and a stepped one (state) must both stay as they are.
  TwoLeaves fresh;
  TwoLeaves stepped;
  stepped.w.mutable_grad() = at::full({2, 3}, 3.0f);
  stepped.chain.step();
  const NamedTensors stepped_state = cloned(stepped.chain.state_dict());
  const at::Tensor stepped_w = stepped.w.detach().clone();

  NamedTensors bad;
  for (const auto& [key, tensor] : good) {
    if (key == "optimizer.state.layer.w.step") continue;  // missing
    if (key == "optimizer.state.layer.bias.momentum_buffer") {
      bad.emplace_back(key, at::zeros({4}));  // wrong shape
    } else if (key == "optimizer.state.layer.w.momentum_buffer") {
      bad.emplace_back(key, tensor.to(at::kDouble));  // wrong dtype
    } else {
      bad.emplace_back(key, tensor);
    }
  }
  bad.emplace_back("optimizer.state.layer.w.exp_avg", at::zeros({2, 3}));     // not SGD state
  bad.emplace_back("optimizer.state.other.momentum_buffer", at::zeros({1}));  // no such param
  bad.emplace_back("model.layer.w", at::zeros({2, 3}));                       // not optimizer

  for (TwoLeaves* t : {&fresh, &stepped}) {
    try {
      t->chain.load_state_dict(bad);
      FAIL() << "expected std::invalid_argument";
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      for (const char* expected :
           {"missing key optimizer.state.layer.w.step",
            "optimizer.state.layer.bias.momentum_buffer: shape [4], expected [3]",
            "optimizer.state.layer.w.momentum_buffer: dtype float64, expected float32",
            "unexpected key optimizer.state.layer.w.exp_avg",
            "unexpected key optimizer.state.other.momentum_buffer", "unexpected key model.layer.w",
            "6 problem(s)"}) {
        EXPECT_NE(message.find(expected), std::string::npos) << expected << "\n" << message;
      }
    }
  }
  EXPECT_TRUE(fresh.chain.state_dict().empty());
  EXPECT_TRUE(at::equal(fresh.w, param({1, 2, 3, 4, 5, 6}, {2, 3})));
  const NamedTensors after = stepped.chain.state_dict();
  ASSERT_EQ(after.size(), stepped_state.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].first, stepped_state[i].first);
    EXPECT_TRUE(at::equal(after[i].second, stepped_state[i].second)) << after[i].first;
  }
  EXPECT_TRUE(at::equal(stepped.w, stepped_w));
  EXPECT_TRUE(stepped.chain.main_grad_if_defined("layer.w").defined() == false);

  fresh.chain.load_state_dict(good);  // and the good one still loads
  EXPECT_EQ(fresh.chain.state_dict().size(), 4u);
}

// The real leaves: AdamW for the bias, Muon for the matrix, keyed by model name.
TEST(ChainedOptimizer, RealAdamWAndMuonStateRoundTrip) {
  auto build = [](at::Tensor w, at::Tensor b) {
    auto chain = std::make_unique<ChainedOptimizer>();
    std::vector<torch::optim::OptimizerParamGroup> adamw_groups;
    adamw_groups.emplace_back(std::vector<at::Tensor>{b},
                              std::make_unique<torch::optim::AdamWOptions>(1e-2));
    chain->add_leaf(
        std::make_unique<AdamW>(std::move(adamw_groups), torch::optim::AdamWOptions(1e-2)),
        {{"layer.bias", b}});
    std::vector<torch::optim::OptimizerParamGroup> muon_groups;
    muon_groups.emplace_back(std::vector<at::Tensor>{w},
                             std::make_unique<MuonOptions>(MuonOptions().lr(0.02)));
    chain->add_leaf(std::make_unique<Muon>(std::move(muon_groups), MuonOptions()),
                    {{"layer.w", w}});
    return chain;
  };
  at::Tensor w1 = at::arange(12, at::kFloat).reshape({3, 4}).div(10).requires_grad_(true);
  at::Tensor b1 = at::arange(3, at::kFloat).requires_grad_(true);
  at::Tensor w2 = w1.detach().clone().requires_grad_(true);
  at::Tensor b2 = b1.detach().clone().requires_grad_(true);
  auto saved = build(w1, b1);
  auto restored = build(w2, b2);
  w1.mutable_grad() = at::linspace(-1, 1, 12).reshape({3, 4});
  b1.mutable_grad() = at::tensor({0.5f, -0.25f, 1.0f});
  saved->step();

  std::map<std::string, at::Tensor> state;
  for (const auto& [key, tensor] : saved->state_dict()) state[key] = tensor.clone();
  std::vector<std::string> keys;
  for (const auto& [key, tensor] : state) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "optimizer.state.layer.bias.exp_avg", "optimizer.state.layer.bias.exp_avg_sq",
                      "optimizer.state.layer.bias.step", "optimizer.state.layer.w.momentum_buffer",
                      "optimizer.state.layer.w.step"}));
  {
    at::NoGradGuard no_grad;
    w2.copy_(w1);
    b2.copy_(b1);
  }
  restored->load_state_dict(NamedTensors(state.begin(), state.end()));
  for (auto& [w, b, chain] : {std::tie(w1, b1, saved), std::tie(w2, b2, restored)}) {
    w.mutable_grad() = at::linspace(1, -2, 12).reshape({3, 4});
    b.mutable_grad() = at::tensor({-1.0f, 0.5f, 2.0f});
    chain->step();
  }
  EXPECT_TRUE(at::equal(w1, w2));
  EXPECT_TRUE(at::equal(b1, b2));
}

}  // namespace
}  // namespace mixtrain
