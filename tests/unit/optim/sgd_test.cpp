// SGD (optim/sgd.h): hand-derived values, bitwise agreement with LibTorch's torch::optim::SGD
// (LibTorch's own port of torch.optim.SGD; Python's torch.optim.SGD is the oracle of
// tests/python/sgd_oracle.py), torch's option checks, copy-back and state export/import.
#include "mixtrain/optim/sgd.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using torch::optim::OptimizerParamGroup;

at::Tensor float_tensor(const std::vector<double>& values) {
  return at::tensor(values, at::kDouble).to(at::kFloat);
}

at::Tensor make_param(const at::Tensor& values) {
  return values.detach().clone().requires_grad_(true);
}

void set_grad(const at::Tensor& param, const at::Tensor& grad) {
  param.mutable_grad() = grad.to(param.scalar_type()).clone();
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

SgdOptions options(double lr, double momentum, double dampening, double wd, bool nesterov) {
  return SgdOptions(lr).momentum(momentum).dampening(dampening).weight_decay(wd).nesterov(nesterov);
}

// Each float op of one step rounds once (|p|, |g| <= 3): two or three roundings of values of
// that size, so 4 float epsilons of max(1, |expected|) bound the difference from double.
double float_tolerance(double expected) {
  return 4 * FLT_EPSILON * std::max(1.0, std::abs(expected));
}

TEST(SgdHand, TwoStepsOfEveryVariant) {
  // Derived from the update of sgd.h in double: d = g + wd p; b1 = d1; b2 = mu b1 + (1-damp) d2;
  // step direction b (or d + mu b with Nesterov); p -= lr * direction.
  const std::vector<double> p0 = {1.0, -2.0, 0.5, 3.0};
  const std::vector<std::vector<double>> grads = {{0.1, -0.2, 0.3, 0.0}, {-0.4, 0.1, 0.2, 0.5}};
  struct Case {
    double momentum, dampening, wd;
    bool nesterov;
  };
  for (const Case c : {Case{0.0, 0.0, 0.1, false}, Case{0.9, 0.0, 0.0, false},
                       Case{0.9, 0.3, 0.05, false}, Case{0.8, 0.0, 0.1, true}}) {
    const double lr = 0.1;
    at::Tensor param = make_param(float_tensor(p0));
    Sgd optimizer({OptimizerParamGroup({param})},
                  options(lr, c.momentum, c.dampening, c.wd, c.nesterov));
    std::vector<double> p = p0, b(p0.size(), 0.0);
    for (size_t step = 0; step < grads.size(); ++step) {
      set_grad(param, float_tensor(grads[step]));
      optimizer.step();
      for (size_t i = 0; i < p.size(); ++i) {
        const double d = grads[step][i] + c.wd * p[i];
        double direction = d;
        if (c.momentum != 0) {
          b[i] = step == 0 ? d : c.momentum * b[i] + (1 - c.dampening) * d;
          direction = c.nesterov ? d + c.momentum * b[i] : b[i];
        }
        p[i] -= lr * direction;
      }
      for (size_t i = 0; i < p.size(); ++i) {
        EXPECT_NEAR(param[i].item<double>(), p[i], float_tolerance(p[i]))
            << "momentum " << c.momentum << " dampening " << c.dampening << " nesterov "
            << c.nesterov << " step " << step + 1 << " element " << i;
      }
    }
    const NamedTensorList state = optimizer.export_state(param);
    ASSERT_EQ(state.back().first, "step");
    EXPECT_EQ(state.back().second.item<int64_t>(), 2);
    EXPECT_EQ(state.size(), c.momentum != 0 ? 2u : 1u);  // no buffer without momentum, as torch
  }
}

TEST(SgdLibTorch, BitwiseEqualToTorchOptimSgd) {
  // torch::optim::SGD runs the same ATen ops as torch/optim/sgd.py's single-tensor path, so
  // the results must agree to the bit, param and momentum buffer, over many steps.
  at::manual_seed(7);
  const at::Tensor start = at::randn({37, 29});
  for (const bool nesterov : {false, true}) {
    for (const double dampening : {0.0, 0.25}) {
      if (nesterov && dampening != 0) continue;
      at::Tensor ours = make_param(start), theirs = make_param(start);
      Sgd optimizer({OptimizerParamGroup({ours})}, options(0.05, 0.9, dampening, 0.01, nesterov));
      torch::optim::SGD reference({theirs}, torch::optim::SGDOptions(0.05)
                                                .momentum(0.9)
                                                .dampening(dampening)
                                                .weight_decay(0.01)
                                                .nesterov(nesterov));
      at::manual_seed(11);
      for (int step = 0; step < 6; ++step) {
        const at::Tensor grad = at::randn({37, 29}) * std::pow(10.0, step - 3);
        set_grad(ours, grad);
        set_grad(theirs, grad);
        optimizer.step();
        reference.step();
      }
      EXPECT_TRUE(bitwise_equal(ours.detach(), theirs.detach())) << nesterov << dampening;
      const auto& ref_state = static_cast<const torch::optim::SGDParamState&>(
          *reference.state().at(theirs.unsafeGetTensorImpl()));
      EXPECT_TRUE(
          bitwise_equal(optimizer.export_state(ours).front().second, ref_state.momentum_buffer()));
    }
  }
}

TEST(SgdOptions, RefusesWhatTorchRefuses) {
  at::Tensor param = make_param(float_tensor({1.0}));
  auto make = [&](const SgdOptions& o) { Sgd optimizer({OptimizerParamGroup({param})}, o); };
  EXPECT_THROW(make(options(-0.1, 0.0, 0.0, 0.0, false)), std::invalid_argument);
  EXPECT_THROW(make(options(0.1, -0.5, 0.0, 0.0, false)), std::invalid_argument);
  EXPECT_THROW(make(options(0.1, 0.0, 0.0, -1.0, false)), std::invalid_argument);
  EXPECT_THROW(make(options(0.1, 0.0, 0.0, 0.0, true)), std::invalid_argument);  // no momentum
  EXPECT_THROW(make(options(0.1, 0.9, 0.1, 0.0, true)), std::invalid_argument);  // dampening
  EXPECT_NO_THROW(make(options(0.1, 0.9, 0.0, 0.0, true)));
  try {
    make(options(0.1, 0.9, 0.1, 0.0, true));
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("nesterov"), std::string::npos) << error.what();
  }
}

TEST(SgdCopyBack, ModelParamIsTheUpdatedParamRounded) {
  at::manual_seed(3);
  at::Tensor main = make_param(at::randn({64}));
  at::Tensor model = main.detach().to(at::kBFloat16);
  Sgd optimizer({OptimizerParamGroup({main})}, options(0.1, 0.9, 0.0, 0.0, true));
  optimizer.set_copy_back(main, model);
  for (int step = 0; step < 3; ++step) {
    set_grad(main, at::randn({64}));
    optimizer.step();
    EXPECT_TRUE(bitwise_equal(model, main.detach().to(at::kBFloat16))) << "step " << step;
  }
}

TEST(SgdState, ImportedStateContinuesBitwise) {
  at::manual_seed(5);
  const at::Tensor start = at::randn({8, 4});
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 4; ++i) grads.push_back(at::randn({8, 4}));
  const SgdOptions o = options(0.05, 0.9, 0.1, 0.01, false);

  at::Tensor straight = make_param(start);
  Sgd uninterrupted({OptimizerParamGroup({straight})}, o);
  at::Tensor first = make_param(start);
  Sgd before({OptimizerParamGroup({first})}, o);
  for (int i = 0; i < 4; ++i) {
    set_grad(straight, grads[i]);
    uninterrupted.step();
    if (i < 2) {
      set_grad(first, grads[i]);
      before.step();
    }
  }
  const NamedTensorList saved = before.export_state(first);
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[0].first, "momentum_buffer");
  EXPECT_EQ(saved[1].first, "step");
  at::Tensor resumed = make_param(first.detach());
  Sgd after({OptimizerParamGroup({resumed})}, o);
  after.import_state(resumed, saved);
  for (int i = 2; i < 4; ++i) {
    set_grad(resumed, grads[i]);
    after.step();
  }
  EXPECT_TRUE(bitwise_equal(resumed.detach(), straight.detach()));
  EXPECT_EQ(after.export_state(resumed)[1].second.item<int64_t>(), 4);

  EXPECT_THROW(after.import_state(resumed, {{"exp_avg", saved[0].second}}), std::invalid_argument);
  EXPECT_THROW(
      after.import_state(resumed, {{"momentum_buffer", at::zeros({3})}, {"step", saved[1].second}}),
      std::invalid_argument);
  EXPECT_THROW(after.import_state(resumed, {{"momentum_buffer", saved[0].second}}),
               std::invalid_argument);  // step missing
}

TEST(SgdHyperparameters, RoundTripAndRefusal) {
  at::Tensor param = make_param(float_tensor({1.0}));
  Sgd optimizer({OptimizerParamGroup({param})}, options(0.1, 0.9, 0.0, 0.01, true));
  const nlohmann::json values = optimizer.group_hyperparameters(0);
  EXPECT_EQ(
      values,
      (nlohmann::json{
          {"momentum", 0.9}, {"dampening", 0.0}, {"weight_decay", 0.01}, {"nesterov", true}}));
  nlohmann::json bad = values;
  bad["dampening"] = 0.5;  // with nesterov: refused, nothing changed
  EXPECT_THROW(optimizer.set_group_hyperparameters(0, bad), std::invalid_argument);
  EXPECT_EQ(optimizer.group_hyperparameters(0), values);
  nlohmann::json other = values;
  other["nesterov"] = false;
  other["dampening"] = 0.5;
  optimizer.set_group_hyperparameters(0, other);
  EXPECT_EQ(optimizer.group_hyperparameters(0), other);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
