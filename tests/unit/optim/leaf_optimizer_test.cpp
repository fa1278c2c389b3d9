// optim/leaf_optimizer: the one state import of the leaves (state_fields, check_state,
// read_state), the same answers for AdamW, SGD and Muon: a step saved as a whole-number float
// (torch.optim's float32 step tensor) is taken, a fractional, negative, non-finite or
// many-valued one refused with every problem named; an empty list clears a parameter's state;
// and set_group_hyperparameters applies options_with_hyperparameters or changes nothing.
#include "mixtrain/optim/leaf_optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixtrain/optim/adamw.h"
#include "mixtrain/optim/muon.h"
#include "mixtrain/optim/sgd.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using torch::optim::OptimizerParamGroup;

struct Case {
  std::string name;
  std::function<std::unique_ptr<LeafOptimizer>(const at::Tensor&)> make;
};

std::vector<Case> leaves() {
  return {
      {"adamw",
       [](const at::Tensor& p) {
         return std::make_unique<AdamW>(std::vector<OptimizerParamGroup>{OptimizerParamGroup({p})},
                                        torch::optim::AdamWOptions(1e-2));
       }},
      {"sgd",
       [](const at::Tensor& p) {
         SgdOptions options(1e-2);
         options.momentum(0.9);
         return std::make_unique<Sgd>(std::vector<OptimizerParamGroup>{OptimizerParamGroup({p})},
                                      options);
       }},
      {"muon", [](const at::Tensor& p) { return std::make_unique<Muon>(std::vector{p}); }},
  };
}

at::Tensor make_param(int64_t seed) {
  at::manual_seed(seed);
  return at::randn({4, 3}).requires_grad_(true);
}

void step_with(LeafOptimizer& leaf, const at::Tensor& param, const at::Tensor& grad) {
  param.mutable_grad() = grad.clone();
  leaf.step();
}

// float32 bits, so that -0 and +0 (or two NaNs) are told apart.
bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() &&
         at::equal(a.detach().contiguous().view(at::kInt), b.detach().contiguous().view(at::kInt));
}

NamedTensorList with_step(NamedTensorList state, const at::Tensor& step) {
  for (auto& [name, value] : state) {
    if (name == "step") value = step;
  }
  return state;
}

std::string import_error(LeafOptimizer& leaf, const at::Tensor& p, const NamedTensorList& state) {
  try {
    leaf.import_state(p, state);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(LeafStateImport, EveryLeafTakesAWholeNumberFloatStepAsItsInteger) {
  for (const Case& c : leaves()) {
    SCOPED_TRACE(c.name);
    const at::Tensor g1 = at::randn({4, 3}), g2 = at::randn({4, 3});
    at::Tensor a = make_param(1);
    auto first = c.make(a);
    step_with(*first, a, g1);
    const NamedTensorList saved = first->export_state(a);
    for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kInt}) {
      at::Tensor b = a.detach().clone().requires_grad_(true);
      auto second = c.make(b);
      second->import_state(b, with_step(saved, at::scalar_tensor(1.0, dtype)));
      const NamedTensorList imported = second->export_state(b);
      EXPECT_EQ(imported.back().first, "step");
      EXPECT_EQ(imported.back().second.scalar_type(), at::kLong);
      EXPECT_EQ(imported.back().second.item<int64_t>(), 1);
      // The same next step as the leaf that never left: the step count drives bias
      // correction (AdamW) and the first-step rule (SGD), so a wrong count would show.
      at::Tensor a2 = a.detach().clone().requires_grad_(true);
      auto control = c.make(a2);
      control->import_state(a2, saved);
      step_with(*control, a2, g2);
      step_with(*second, b, g2);
      EXPECT_TRUE(bitwise_equal(a2, b));
    }
  }
}

TEST(LeafStateImport, EveryLeafRefusesABadStepAndChangesNothing) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<std::pair<at::Tensor, std::string>> bad_steps = {
      {at::scalar_tensor(1.5), "'step' must be one whole number >= 0, got 1.5"},
      {at::scalar_tensor(-1, at::kLong), "'step' must be one whole number >= 0, got -1"},
      {at::scalar_tensor(-2.0), "'step' must be one whole number >= 0, got -2"},
      {at::scalar_tensor(nan), "'step' must be one whole number >= 0, got nan"},
      {at::scalar_tensor(1e30), "'step' must be one whole number >= 0, got 1e+30"},
      {at::ones({2}, at::kLong), "'step' must be one whole number >= 0, got a Long tensor"},
      {at::scalar_tensor(true, at::kBool),
       "'step' must be one whole number >= 0, got a Bool tensor"},
  };
  for (const Case& c : leaves()) {
    SCOPED_TRACE(c.name);
    at::Tensor p = make_param(2);
    auto leaf = c.make(p);
    step_with(*leaf, p, at::randn({4, 3}));
    const NamedTensorList good = leaf->export_state(p);
    std::vector<at::Tensor> before;
    for (const auto& [name, value] : good) before.push_back(value.clone());
    for (const auto& [step, expected] : bad_steps) {
      const std::string message = import_error(*leaf, p, with_step(good, step));
      EXPECT_EQ(message.rfind(c.name + ": import_state: ", 0), 0u) << message;
      EXPECT_NE(message.find(expected), std::string::npos) << expected << "\n" << message;
      const NamedTensorList after = leaf->export_state(p);
      ASSERT_EQ(after.size(), before.size());
      for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(at::equal(after[i].second, before[i]));
    }
  }
}

TEST(LeafStateImport, EveryProblemIsNamedInOneMessage) {
  at::Tensor p = make_param(3);
  AdamW adamw({OptimizerParamGroup({p})});
  const std::string message = import_error(adamw, p,
                                           {{"exp_avg", at::zeros({3, 4})},
                                            {"momentum_buffer", at::zeros({4, 3})},
                                            {"exp_avg", at::zeros({4, 3})},
                                            {"step", at::scalar_tensor(0.5)}});
  for (const std::string expected :
       {"unknown key 'momentum_buffer'", "duplicate key 'exp_avg'", "missing key 'exp_avg_sq'",
        "'exp_avg' has shape [3, 4], the parameter [4, 3]",
        "'step' must be one whole number >= 0, got 0.5"}) {
    EXPECT_NE(message.find(expected), std::string::npos) << expected << "\n" << message;
  }
  EXPECT_EQ(adamw.check_state(p, {{"exp_avg", at::Tensor()}}),
            (std::vector<std::string>{"'exp_avg' is undefined", "missing key 'exp_avg_sq'",
                                      "missing key 'step'"}));
  EXPECT_EQ(adamw.check_state(at::zeros({4, 3}), {}),
            (std::vector<std::string>{"parameter is not in any group"}));
  EXPECT_TRUE(adamw.export_state(p).empty());
}

TEST(LeafStateImport, AnEmptyListClearsTheStateOfEveryLeaf) {
  for (const Case& c : leaves()) {
    SCOPED_TRACE(c.name);
    at::Tensor p = make_param(4);
    auto leaf = c.make(p);
    step_with(*leaf, p, at::randn({4, 3}));
    ASSERT_FALSE(leaf->export_state(p).empty());
    EXPECT_TRUE(leaf->check_state(p, {}).empty());
    leaf->import_state(p, {});
    EXPECT_TRUE(leaf->export_state(p).empty());
  }
}

TEST(LeafStateImport, OptionalFieldsMayBeAbsent) {
  // SGD keeps no momentum buffer while momentum is 0 (torch.optim's sgd.py): a step alone is
  // its whole state; AdamW's moments are required.
  at::Tensor p = make_param(5);
  Sgd sgd({OptimizerParamGroup({p})}, SgdOptions(1e-2));
  sgd.import_state(p, {{"step", at::scalar_tensor(3.0)}});
  const NamedTensorList state = sgd.export_state(p);
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].second.item<int64_t>(), 3);
  EXPECT_FALSE(sgd.is_count_field("momentum_buffer"));
  EXPECT_TRUE(sgd.is_count_field("step"));
  AdamW adamw({OptimizerParamGroup({p})});
  EXPECT_NE(
      import_error(adamw, p, {{"step", at::scalar_tensor(3.0)}}).find("missing key 'exp_avg'"),
      std::string::npos);
}

TEST(LeafHyperparameters, OptionsWithHyperparametersIsPureAndSetAppliesIt) {
  at::Tensor p = make_param(6);
  AdamW adamw({OptimizerParamGroup({p})}, torch::optim::AdamWOptions(0.5).weight_decay(0.1));
  nlohmann::json values = adamw.group_hyperparameters(0);
  values["weight_decay"] = 0.25;
  const auto options = adamw.options_with_hyperparameters(0, values);
  EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(*options).weight_decay(), 0.25);
  EXPECT_EQ(options->get_lr(), 0.5);  // lr is the owner's (base lr * schedule factor)
  EXPECT_EQ(adamw.group_hyperparameters(0)["weight_decay"], 0.1);  // unchanged
  adamw.set_group_hyperparameters(0, values);
  EXPECT_EQ(adamw.group_hyperparameters(0), values);
  values["eps"] = -1.0;
  EXPECT_THROW(adamw.set_group_hyperparameters(0, values), std::invalid_argument);
  EXPECT_EQ(adamw.group_hyperparameters(0)["eps"], 1e-8);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
