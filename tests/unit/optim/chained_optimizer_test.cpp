#include "mixtrain/optim/chained_optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <torch/arg.h>
#include "support/test_sgd.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>

#include "mixtrain/optim/adamw.h"
#include "mixtrain/optim/mixed_precision_optimizer.h"
#include "mixtrain/optim/muon.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

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

// accumulate_main_grad's first call writes 0 + grad in one pass; it must give the bits of the
// zeroed float32 buffer plus the grad (the path it replaced): -0 becomes +0, everything else,
// NaN and infinities included, is the exactly widened bfloat16 value. The second call adds.
TEST(ChainedOptimizer, AccumulateMainGradMatchesZerosPlusGradBitwise) {
  TwoLeaves t;
  const int16_t bits[] = {0x3F80, static_cast<int16_t>(0x8000), 0x0000, 0x0001,
                          0x7F80, static_cast<int16_t>(0xFFC0)};  // 1, -0, +0, subnormal, inf, NaN
  at::Tensor raw = at::empty({6}, at::kShort);
  for (int i = 0; i < 6; ++i) raw[i] = bits[i];
  const at::Tensor grad = raw.view(at::kBFloat16).reshape({2, 3});
  const at::Tensor expected = at::zeros({2, 3}, at::kFloat).add_(grad);
  t.chain.accumulate_main_grad("layer.w", grad);
  const at::Tensor got = t.chain.main_grad("layer.w");
  ASSERT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_EQ(std::memcmp(got.data_ptr(), expected.data_ptr(), expected.nbytes()), 0);
  EXPECT_FALSE(std::signbit(got.view({-1})[1].item<float>()));  // -0 became +0
  t.chain.accumulate_main_grad("layer.w", at::ones({2, 3}, at::kBFloat16));
  EXPECT_EQ(t.chain.main_grad("layer.w")[0][0].item<float>(), 2.0f);
  EXPECT_THROW(t.chain.accumulate_main_grad("layer.w", at::ones({3})), std::logic_error);
  EXPECT_THROW(t.chain.accumulate_main_grad("nope", at::ones({3})), std::invalid_argument);
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
    c10::NoGradGuard no_grad;
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

// fp32-main-params §9.3 branch 2: state saved in another floating dtype (a bfloat16 run's, or
// float64) is cast to the live state's dtype, as torch.optim.Optimizer.load_state_dict casts to the
// param's.
TEST(ChainedOptimizer, LoadStateDictCastsFloatingStateToTheLiveDtype) {
  TwoLeaves saved;
  saved.w.mutable_grad() = at::full({2, 3}, 0.3f);
  saved.bias.mutable_grad() = at::full({3}, -0.7f);
  saved.chain.step();
  for (const c10::ScalarType dtype : {at::kBFloat16, at::kDouble}) {
    NamedTensors state;
    for (const auto& [key, tensor] : saved.chain.state_dict()) {
      state.emplace_back(
          key, at::isFloatingType(tensor.scalar_type()) ? tensor.to(dtype) : tensor.clone());
    }
    TwoLeaves restored;
    restored.chain.load_state_dict(state);
    const auto loaded = restored.chain.state_dict();
    ASSERT_EQ(loaded.size(), state.size());
    for (size_t i = 0; i < loaded.size(); ++i) {
      const at::Tensor& live = loaded[i].second;
      const at::Tensor& given = state[i].second;
      EXPECT_EQ(live.scalar_type(), saved.chain.state_dict()[i].second.scalar_type());
      // bfloat16 -> float32 is exact; float64 -> float32 rounds the float32 values it was
      // widened from back to themselves: both equal the given values cast.
      EXPECT_TRUE(at::equal(live, given.to(live.scalar_type()))) << loaded[i].first;
    }
  }
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
      bad.emplace_back(key, tensor.to(at::kLong));  // not a floating dtype
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
            "optimizer.state.layer.w.momentum_buffer: dtype int64, expected float32",
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
    c10::NoGradGuard no_grad;
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

// ---- param-group hyper-parameters (param_groups_state / load_param_groups_state) ------------

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.detach().contiguous(), cb = b.detach().contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// The hyper-parameters of one real chain: AdamW with a decay group (embed) and a no-decay
// group (bias, norm), as build_optimizer splits them, and one Muon group (two matrices).
struct Hyper {
  double adamw_lr, adamw_no_decay_lr, beta1, beta2, eps, adamw_wd;
  MuonOptions muon;
};

Hyper saved_hyper() {
  return {1e-3,
          5e-4,
          0.9,
          0.95,
          1e-8,
          0.1,
          MuonOptions()
              .lr(0.02)
              .weight_decay(0.01)
              .momentum(0.9)
              .nesterov(true)
              .ns_steps(3)
              .ns_variant("custom")
              .ns_coefficients({{3.4445, -4.775, 2.0315}, {3.0, -3.2, 1.2}, {2.0, -1.5, 0.5}})
              .ns_epsilon(1e-6)
              .ns_dtype(at::kFloat)
              .matched_adamw_rms(0.18)
              .adjust_lr_fn(AdjustLrFn::kOriginal)
              .momentum_style(MomentumStyle::kEma)
              .communication_dtype(at::kFloat)
              .normuon(false)  // true changes the state's keys (muon_test covers its round trip)
              .normuon_beta2(0.9)
              .normuon_epsilon(1e-8)
              .cautious_weight_decay(true)};
}

// Every value differs from saved_hyper() except the no-decay group's weight decay (0 in both).
Hyper other_hyper() {
  return {2e-3, 2e-3, 0.8, 0.99, 1e-6, 0.01, MuonOptions().lr(0.05).nesterov(false)};
}

struct RealChain {
  at::Tensor embed = at::linspace(-1, 1, 8).reshape({4, 2}).requires_grad_(true);
  at::Tensor bias = at::tensor({0.5f, -0.25f, 1.0f}).requires_grad_(true);
  at::Tensor norm = at::tensor({1.0f, 0.75f}).requires_grad_(true);
  at::Tensor w1 = at::arange(12, at::kFloat).reshape({3, 4}).div(10).requires_grad_(true);
  at::Tensor w2 = at::cos(at::arange(12, at::kFloat)).reshape({3, 4}).requires_grad_(true);
  ChainedOptimizer chain;

  explicit RealChain(const Hyper& h) {
    using torch::optim::AdamWOptions;
    auto adamw = [&](double lr, double wd) {
      return std::make_unique<AdamWOptions>(
          AdamWOptions(lr).betas({h.beta1, h.beta2}).eps(h.eps).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> adamw_groups;
    adamw_groups.emplace_back(std::vector<at::Tensor>{embed}, adamw(h.adamw_lr, h.adamw_wd));
    adamw_groups.emplace_back(std::vector<at::Tensor>{bias, norm}, adamw(h.adamw_no_decay_lr, 0));
    chain.add_leaf(std::make_unique<AdamW>(std::move(adamw_groups), *adamw(h.adamw_lr, h.adamw_wd)),
                   {{"embed.weight", embed}, {"layers.0.bias", bias}, {"norm.weight", norm}});
    std::vector<torch::optim::OptimizerParamGroup> muon_groups;
    muon_groups.emplace_back(std::vector<at::Tensor>{w1, w2},
                             std::make_unique<MuonOptions>(h.muon));
    chain.add_leaf(std::make_unique<Muon>(std::move(muon_groups), h.muon),
                   {{"layers.0.w", w1}, {"layers.1.w", w2}});
  }
  std::vector<at::Tensor> params() const { return {embed, bias, norm, w1, w2}; }
  void set_grads(int k) {
    for (size_t i = 0; i < params().size(); ++i) {
      at::Tensor p = params()[i];
      p.mutable_grad() =
          at::sin(at::arange(p.numel(), at::kFloat) * 0.7 + static_cast<double>(k + i)).view_as(p);
    }
  }
  void copy_params_from(const RealChain& other) {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params().size(); ++i) params()[i].copy_(other.params()[i]);
  }
  std::vector<double> lrs() const {
    std::vector<double> out;
    for (const auto& leaf : chain.leaves()) {
      for (const auto& group : leaf->param_groups()) out.push_back(group.options().get_lr());
    }
    return out;
  }
};

void expect_same_options(const ChainedOptimizer& a, const ChainedOptimizer& b) {
  ASSERT_EQ(a.leaves().size(), b.leaves().size());
  for (size_t l = 0; l < a.leaves().size(); ++l) {
    const auto& ga = a.leaves()[l]->param_groups();
    const auto& gb = b.leaves()[l]->param_groups();
    ASSERT_EQ(ga.size(), gb.size());
    for (size_t g = 0; g < ga.size(); ++g) {
      SCOPED_TRACE(a.leaves()[l]->kind() + " group " + std::to_string(g));
      if (const auto* x = dynamic_cast<const torch::optim::AdamWOptions*>(&ga[g].options())) {
        const auto& y = dynamic_cast<const torch::optim::AdamWOptions&>(gb[g].options());
        EXPECT_EQ(x->lr(), y.lr());
        EXPECT_EQ(x->betas(), y.betas());
        EXPECT_EQ(x->eps(), y.eps());
        EXPECT_EQ(x->weight_decay(), y.weight_decay());
        EXPECT_EQ(x->amsgrad(), y.amsgrad());
      } else {
        const auto& m = dynamic_cast<const MuonOptions&>(ga[g].options());
        const auto& n = dynamic_cast<const MuonOptions&>(gb[g].options());
        EXPECT_EQ(m.lr(), n.lr());
        EXPECT_EQ(m.weight_decay(), n.weight_decay());
        EXPECT_EQ(m.momentum(), n.momentum());
        EXPECT_EQ(m.nesterov(), n.nesterov());
        EXPECT_EQ(m.ns_steps(), n.ns_steps());
        EXPECT_EQ(m.ns_variant(), n.ns_variant());
        EXPECT_EQ(m.ns_coefficients(), n.ns_coefficients());
        EXPECT_EQ(m.ns_epsilon(), n.ns_epsilon());
        EXPECT_EQ(m.ns_dtype(), n.ns_dtype());
        EXPECT_EQ(m.matched_adamw_rms(), n.matched_adamw_rms());
        EXPECT_EQ(m.adjust_lr_fn(), n.adjust_lr_fn());
        EXPECT_EQ(m.momentum_style(), n.momentum_style());
        EXPECT_EQ(m.communication_dtype(), n.communication_dtype());
        EXPECT_EQ(m.normuon(), n.normuon());
        EXPECT_EQ(m.normuon_beta2(), n.normuon_beta2());
        EXPECT_EQ(m.normuon_epsilon(), n.normuon_epsilon());
        EXPECT_EQ(m.cautious_weight_decay(), n.cautious_weight_decay());
      }
    }
  }
}

TEST(ChainedOptimizerParamGroups, StateListsEveryGroupWithModelNamesBaseLrAndHyperParameters) {
  RealChain t(saved_hyper());
  t.chain.set_lr_factor(0.5);  // base_lr is the lr the factor multiplies, not the current lr
  const nlohmann::json expected = nlohmann::json::parse(R"([
    {"optimizer": "adamw", "group": 0, "params": ["embed.weight"], "base_lr": 0.001,
     "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "amsgrad": false},
    {"optimizer": "adamw", "group": 1, "params": ["layers.0.bias", "norm.weight"],
     "base_lr": 0.0005, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0, "amsgrad": false},
    {"optimizer": "muon", "group": 0, "params": ["layers.0.w", "layers.1.w"], "base_lr": 0.02,
     "weight_decay": 0.01, "momentum": 0.9, "nesterov": true, "ns_steps": 3,
     "ns_variant": "custom",
     "ns_coefficients": [[3.4445, -4.775, 2.0315], [3.0, -3.2, 1.2], [2.0, -1.5, 0.5]],
     "ns_epsilon": 1e-6, "ns_dtype": "float32", "matched_adamw_rms": 0.18,
     "adjust_lr_fn": "original", "momentum_style": "ema", "communication_dtype": "float32",
     "normuon": false, "normuon_beta2": 0.9, "normuon_epsilon": 1e-8,
     "cautious_weight_decay": true}
  ])");
  EXPECT_EQ(t.chain.param_groups_state(), expected) << t.chain.param_groups_state().dump(2);
  EXPECT_TRUE(t.chain.param_groups_state()[2]["ns_steps"].is_number_integer());
}

TEST(ChainedOptimizerParamGroups, RoundTripRestoresEveryOptionAndReportsTheDifferences) {
  RealChain saved(saved_hyper());
  RealChain restored(other_hyper());
  restored.chain.set_lr_factor(0.25);
  // Through text, as a checkpoint stores it: doubles print in round-trip form.
  const nlohmann::json state = nlohmann::json::parse(saved.chain.param_groups_state().dump());
  const std::vector<std::string> differences = restored.chain.load_param_groups_state(state);

  EXPECT_EQ(restored.chain.param_groups_state(), saved.chain.param_groups_state());
  // The current lr is the loaded base lr times the last factor.
  EXPECT_EQ(restored.lrs(), (std::vector<double>{1e-3 * 0.25, 5e-4 * 0.25, 0.02 * 0.25}));
  saved.chain.set_lr_factor(0.25);
  expect_same_options(saved.chain, restored.chain);
  restored.chain.set_lr_factor(0.5);
  EXPECT_EQ(restored.lrs(), (std::vector<double>{1e-3 * 0.5, 5e-4 * 0.5, 0.02 * 0.5}));
  saved.chain.set_lr_factor(0.5);
  expect_same_options(saved.chain, restored.chain);

  const std::vector<std::string> expected = {
      "adamw group 0 base_lr: checkpoint 0.001, config 0.002",
      "adamw group 0 betas: checkpoint [0.9,0.95], config [0.8,0.99]",
      "adamw group 0 eps: checkpoint 1e-08, config 1e-06",
      "adamw group 0 weight_decay: checkpoint 0.1, config 0.01",
      "adamw group 1 base_lr: checkpoint 0.0005, config 0.002",
      "adamw group 1 betas: checkpoint [0.9,0.95], config [0.8,0.99]",
      "adamw group 1 eps: checkpoint 1e-08, config 1e-06",
      "muon group 0 adjust_lr_fn: checkpoint original, config match_rms_adamw",
      "muon group 0 base_lr: checkpoint 0.02, config 0.05",
      "muon group 0 cautious_weight_decay: checkpoint true, config false",
      "muon group 0 communication_dtype: checkpoint float32, config bfloat16",
      "muon group 0 matched_adamw_rms: checkpoint 0.18, config 0.2",
      "muon group 0 momentum: checkpoint 0.9, config 0.95",
      "muon group 0 momentum_style: checkpoint ema, config sum",
      "muon group 0 nesterov: checkpoint true, config false",
      "muon group 0 normuon_beta2: checkpoint 0.9, config 0.95",
      "muon group 0 normuon_epsilon: checkpoint 1e-08, config 1e-10",
      "muon group 0 ns_coefficients: checkpoint [[3.4445,-4.775,2.0315],[3.0,-3.2,1.2],"
      "[2.0,-1.5,0.5]], config []",
      "muon group 0 ns_dtype: checkpoint float32, config bfloat16",
      "muon group 0 ns_epsilon: checkpoint 1e-06, config 1e-07",
      "muon group 0 ns_steps: checkpoint 3, config 5",
      "muon group 0 ns_variant: checkpoint custom, config asym5",
      "muon group 0 weight_decay: checkpoint 0.01, config 0.0",
  };
  std::vector<std::string> sorted = differences;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, expected);
  // Loading what it already has reports nothing.
  EXPECT_TRUE(restored.chain.load_param_groups_state(state).empty());
}

TEST(ChainedOptimizerParamGroups, LoadedHyperParametersTakeEffectBitwise) {
  RealChain saved(saved_hyper());
  saved.chain.set_lr_factor(0.5);
  saved.set_grads(0);
  saved.chain.step();
  saved.chain.zero_grad();

  RealChain restored(other_hyper());
  restored.copy_params_from(saved);
  restored.chain.set_lr_factor(0.5);
  restored.chain.load_param_groups_state(saved.chain.param_groups_state());
  restored.chain.load_state_dict(cloned(saved.chain.state_dict()));

  RealChain control(other_hyper());  // the same but without the hyper-parameters
  control.copy_params_from(saved);
  control.chain.set_lr_factor(0.5);
  control.chain.load_state_dict(cloned(saved.chain.state_dict()));

  for (RealChain* t : {&saved, &restored, &control}) {
    t->chain.set_lr_factor(0.75);
    t->set_grads(1);
    t->chain.step();
  }
  for (size_t i = 0; i < saved.params().size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(bitwise_equal(saved.params()[i], restored.params()[i]));
    EXPECT_FALSE(bitwise_equal(saved.params()[i], control.params()[i]));
  }
}

TEST(ChainedOptimizerParamGroups, LoadChecksEverythingAndModifiesNothingOnError) {
  RealChain source(saved_hyper());
  const nlohmann::json good = source.chain.param_groups_state();
  RealChain t(other_hyper());
  t.chain.set_lr_factor(0.5);
  const nlohmann::json before = t.chain.param_groups_state();
  const std::vector<double> lrs_before = t.lrs();

  struct Case {
    std::string what;
    std::function<void(nlohmann::json&)> edit;
    std::vector<std::string> expected;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {"not an array",
       [](nlohmann::json& j) { j = nlohmann::json::object(); },
       {"optimizer param groups: expected a JSON array, got object"}},
      {"one group fewer",
       [](nlohmann::json& j) { j.erase(2); },
       {"the checkpoint has 2 param group(s), this optimizer has 3 (adamw group 0, adamw group 1, "
        "muon group 0)"}},
      {"a param fewer",
       [](nlohmann::json& j) { j[2]["params"].erase(1); },
       {"muon group 0: params differ: the checkpoint's group has 1, this optimizer's has 2; first "
        "difference at position 1: checkpoint (none), this optimizer 'layers.1.w'"}},
      {"another param",
       [](nlohmann::json& j) { j[1]["params"][0] = "layers.0.b"; },
       {"adamw group 1: params differ: the checkpoint's group has 2, this optimizer's has 2; "
        "first difference at position 0: checkpoint 'layers.0.b', this optimizer "
        "'layers.0.bias'"}},
      {"groups swapped",
       [](nlohmann::json& j) { std::swap(j[1], j[2]); },
       {"param group 1: optimizer differs: checkpoint muon, this optimizer adamw (adamw group 1)",
        "param group 2: optimizer differs: checkpoint adamw, this optimizer muon (muon group 0)",
        "2 problem(s)"}},
      {"negative group index",
       [](nlohmann::json& j) { j[1]["group"] = -1; },
       {"adamw group 1: the checkpoint's group index is -1, expected 1"}},
      {"group index",
       [](nlohmann::json& j) { j[1]["group"] = 3; },
       {"adamw group 1: the checkpoint's group index is 3, expected 1"}},
      {"missing eps",
       [](nlohmann::json& j) { j[0].erase("eps"); },
       {"adamw group 0: missing field 'eps'"}},
      {"missing base_lr",
       [](nlohmann::json& j) { j[2].erase("base_lr"); },
       {"muon group 0: missing field 'base_lr'"}},
      {"missing optimizer",
       [](nlohmann::json& j) { j[1].erase("optimizer"); },
       {"adamw group 1: missing field 'optimizer'"}},
      {"nesterov a string",
       [](nlohmann::json& j) { j[2]["nesterov"] = "yes"; },
       {"muon group 0: field 'nesterov' must be a boolean, got string"}},
      {"ns_steps a float",
       [](nlohmann::json& j) { j[2]["ns_steps"] = 3.0; },
       {"muon group 0: field 'ns_steps' must be an integer, got number"}},
      {"betas of three",
       [](nlohmann::json& j) { j[0]["betas"].push_back(0.5); },
       {"adamw group 0: field 'betas' must be an array of two numbers, got array of size 3"}},
      {"base_lr a string",
       [](nlohmann::json& j) { j[0]["base_lr"] = "0.1"; },
       {"adamw group 0: field 'base_lr' must be a number, got string"}},
      {"negative eps",
       [](nlohmann::json& j) { j[0]["eps"] = -1e-8; },
       {"adamw group 0: invalid eps"}},
      {"negative base_lr",
       [](nlohmann::json& j) { j[1]["base_lr"] = -0.1; },
       {"adamw group 1: base_lr must be >= 0, got -0.1"}},
      {"ns_steps 0",
       [](nlohmann::json& j) { j[2]["ns_steps"] = 0; },
       {"muon group 0: ns_steps must be > 0, got 0"}},
      {"custom schedule length",
       [](nlohmann::json& j) { j[2]["ns_steps"] = 2; },
       {"muon group 0: custom Newton-Schulz schedule has 3 coefficient sets; muon_ns_steps=2"}},
      {"unknown momentum style",
       [](nlohmann::json& j) { j[2]["momentum_style"] = "heavy"; },
       {"muon group 0: field 'momentum_style': unknown value 'heavy' (expected sum, ema, "
        "ema_add)"}},
      {"float16 ns_dtype",
       [](nlohmann::json& j) { j[2]["ns_dtype"] = "float16"; },
       {"muon group 0: field 'ns_dtype': unknown value 'float16' (expected bfloat16, float32)"}},
      {"amsgrad",
       [](nlohmann::json& j) { j[1]["amsgrad"] = true; },
       {"adamw group 1: amsgrad is not supported"}},
      {"an lr field",
       [](nlohmann::json& j) { j[1]["lr"] = 0.1; },
       {"adamw group 1: unexpected field 'lr'"}},
      // Valid changes to the AdamW groups are undone when the Muon group fails.
      {"valid groups then a bad one",
       [](nlohmann::json& j) { j[2]["momentum"] = 1.0; },
       {"muon group 0: momentum must be in [0, 1)", "1 problem(s)"}},
      {"several problems",
       [](nlohmann::json& j) {
         j[0]["weight_decay"] = -1.0;
         j[2]["ns_steps"] = 0;
       },
       {"adamw group 0: invalid weight_decay", "muon group 0: ns_steps must be > 0, got 0",
        "2 problem(s)"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    nlohmann::json bad = good;
    c.edit(bad);
    try {
      t.chain.load_param_groups_state(bad);
      ADD_FAILURE() << "expected std::invalid_argument";
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      for (const auto& expected : c.expected) {
        EXPECT_NE(message.find(expected), std::string::npos) << expected << "\n" << message;
      }
    }
    EXPECT_EQ(t.chain.param_groups_state(), before);
    EXPECT_EQ(t.lrs(), lrs_before);
  }
  // And the good one still loads, with group indices as signed or unsigned JSON integers.
  nlohmann::json signed_indices = good;
  for (auto& group : signed_indices)
    group["group"] = static_cast<int>(group["group"].get<size_t>());
  ASSERT_TRUE(signed_indices[1]["group"].is_number_integer() &&
              !signed_indices[1]["group"].is_number_unsigned());
  EXPECT_FALSE(t.chain.load_param_groups_state(signed_indices).empty());
  EXPECT_EQ(t.chain.param_groups_state(), good);
}

// The planning half alone changes nothing, even for a plan that would change every value; a
// plan with problems holds them all and apply_param_groups refuses it (a programming error).
TEST(ChainedOptimizerParamGroups, PlanChangesNothingAndApplyTakesOnlyAGoodPlan) {
  RealChain source(saved_hyper());
  const nlohmann::json good = source.chain.param_groups_state();
  RealChain t(other_hyper());
  const nlohmann::json before = t.chain.param_groups_state();
  const std::vector<double> lrs_before = t.lrs();
  ChainedOptimizer::ParamGroupsPlan plan = t.chain.plan_param_groups(good);
  EXPECT_TRUE(plan.ok());
  EXPECT_EQ(plan.error(), "");
  nlohmann::json bad = good;
  bad[0]["eps"] = -1.0;
  bad[2]["ns_steps"] = 0;
  ChainedOptimizer::ParamGroupsPlan refused = t.chain.plan_param_groups(bad);
  ASSERT_EQ(refused.problems().size(), 2u);
  EXPECT_NE(refused.error().find("optimizer param groups: 2 problem(s)"), std::string::npos);
  EXPECT_EQ(t.chain.param_groups_state(), before);
  EXPECT_EQ(t.lrs(), lrs_before);
  EXPECT_THROW(t.chain.apply_param_groups(std::move(refused)), std::logic_error);
  EXPECT_EQ(t.chain.param_groups_state(), before);
  EXPECT_FALSE(t.chain.apply_param_groups(std::move(plan)).empty());
  EXPECT_EQ(t.chain.param_groups_state(), good);
}

// check_state_dict asks each leaf for its values (LeafOptimizer::check_state): a step saved as
// a whole-number float loads as that integer; a fractional one is a problem naming the
// parameter and its leaf, and nothing loads.
TEST(ChainedOptimizerState, TheLeavesCheckTheStepValues) {
  RealChain saved(saved_hyper());
  saved.set_grads(0);
  saved.chain.step();
  auto is_step = [](const std::string& key) {
    return key.size() > 5 && key.compare(key.size() - 5, 5, ".step") == 0;
  };
  NamedTensors floats = cloned(saved.chain.state_dict());
  for (auto& [key, t] : floats) {
    if (is_step(key)) t = t.to(at::kFloat);
  }
  RealChain restored(saved_hyper());
  restored.chain.load_state_dict(floats);
  for (const auto& [key, t] : restored.chain.state_dict()) {
    if (is_step(key)) {
      EXPECT_EQ(t.scalar_type(), at::kLong) << key;
      EXPECT_EQ(t.item<int64_t>(), 1) << key;
    }
  }

  NamedTensors fractional = cloned(saved.chain.state_dict());
  for (auto& [key, t] : fractional) {
    if (key == std::string(kOptimizerStatePrefix) + "layers.0.w.step") t = at::scalar_tensor(0.5);
  }
  RealChain fresh(saved_hyper());
  try {
    fresh.chain.load_state_dict(fractional);
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what())
                  .find(std::string(kOptimizerStatePrefix) +
                        "layers.0.w: muon: 'step' must be one whole number >= 0, got 0.5"),
              std::string::npos)
        << error.what();
  }
  EXPECT_TRUE(fresh.chain.state_dict().empty());  // the state created to check is gone again
}

// After the mixed-precision wrapper swapped fp32 main params into the leaf groups, "params"
// still lists the model names, and loading still matches them.
TEST(ChainedOptimizerParamGroups, ParamsAreModelNamesBehindTheMixedPrecisionWrapper) {
  auto build = [](double wd) {
    at::Tensor w = at::linspace(-1, 1, 12).reshape({3, 4}).to(at::kBFloat16).requires_grad_(true);
    at::Tensor b = at::tensor({0.5f, -0.25f}).requires_grad_(true);
    auto chain = std::make_unique<ChainedOptimizer>();
    std::vector<torch::optim::OptimizerParamGroup> adamw_groups;
    adamw_groups.emplace_back(std::vector<at::Tensor>{b},
                              std::make_unique<torch::optim::AdamWOptions>(
                                  torch::optim::AdamWOptions(1e-2).weight_decay(wd)));
    chain->add_leaf(
        std::make_unique<AdamW>(std::move(adamw_groups), torch::optim::AdamWOptions(1e-2)),
        {{"out.bias", b}});
    chain->add_leaf(std::make_unique<Muon>(std::vector<at::Tensor>{w}, MuonOptions()),
                    {{"layers.0.w", w}});
    return std::make_unique<MixedPrecisionOptimizer>(std::move(chain));
  };
  auto saved = build(0.1);
  auto restored = build(0.0);
  EXPECT_FALSE(saved->main_param("layers.0.w").is_same(saved->chained().model_param("layers.0.w")));
  const nlohmann::json state = saved->chained().param_groups_state();
  EXPECT_EQ(state[0]["params"], nlohmann::json({"out.bias"}));
  EXPECT_EQ(state[1]["params"], nlohmann::json({"layers.0.w"}));
  EXPECT_EQ(restored->chained().load_param_groups_state(state),
            std::vector<std::string>{"adamw group 0 weight_decay: checkpoint 0.1, config 0.0"});
  EXPECT_EQ(restored->chained().param_groups_state(), state);
}

// The test double's hyper-parameters go through the same path.
TEST(ChainedOptimizerParamGroups, TestDoubleLeavesRoundTrip) {
  TwoLeaves saved;
  TwoLeaves restored;
  const nlohmann::json state = saved.chain.param_groups_state();
  EXPECT_EQ(state[1], nlohmann::json::parse(R"({"optimizer": "sgd", "group": 0,
      "params": ["layer.bias"], "base_lr": 0.5, "weight_decay": 0.1})"));
  nlohmann::json changed = state;
  changed[0]["weight_decay"] = 0.25;
  changed[0]["base_lr"] = 0.2;
  EXPECT_EQ(restored.chain.load_param_groups_state(changed),
            (std::vector<std::string>{"sgd group 0 base_lr: checkpoint 0.2, config 0.1",
                                      "sgd group 0 weight_decay: checkpoint 0.25, config 0.0"}));
  EXPECT_EQ(restored.a->param_groups()[0].options().get_lr(), 0.2);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
