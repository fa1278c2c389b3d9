#include "mixtrain/optim/mixed_precision_optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <torch/arg.h>
#include "support/test_sgd.h"

#include <stdexcept>

#include "mixtrain/core/logging.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using test_doubles::make_sgd;
using test_doubles::TestSgd;

// A small model: "layer.w" bfloat16 [2, 3] and "layer.b" float32 [3] in leaf `a` (lr 0.1),
// "layer.m" bfloat16 [3, 4] in leaf `mu` (lr 0.05, wd 0.1), standing in for AdamW and Muon.
struct Stack {
  at::Tensor w, b, m;
  TestSgd* a = nullptr;
  TestSgd* mu = nullptr;
  std::unique_ptr<MixedPrecisionOptimizer> opt;

  explicit Stack(at::ScalarType low = at::kBFloat16, DynamicLossScalerOptions scaler = {}) {
    w = at::linspace(-1, 1, 6).reshape({2, 3}).to(low).requires_grad_(true);
    b = at::tensor({0.5f, -0.25f, 0.125f}).requires_grad_(true);
    m = at::arange(12, at::kFloat).div(7).reshape({3, 4}).to(low).requires_grad_(true);
    auto chain = std::make_unique<ChainedOptimizer>();
    auto leaf_a = make_sgd({w, b}, 0.1);
    auto leaf_mu = make_sgd({m}, 0.05, 0.1);
    a = leaf_a.get();
    mu = leaf_mu.get();
    chain->add_leaf(std::move(leaf_a), {{"layer.w", w}, {"layer.b", b}});
    chain->add_leaf(std::move(leaf_mu), {{"layer.m", m}});
    opt = std::make_unique<MixedPrecisionOptimizer>(std::move(chain), scaler);
  }
  const at::Tensor& main(const std::string& name) const { return opt->main_param(name); }
  // Gradients of micro-batch/step k, as backward would leave them in the model dtype.
  void set_grads(int k, double scale = 1.0) {
    w.mutable_grad() =
        (at::sin(at::arange(6, at::kFloat) + k) * scale).reshape({2, 3}).to(w.scalar_type());
    b.mutable_grad() = at::cos(at::arange(3, at::kFloat) * k) * scale;
    m.mutable_grad() =
        (at::cos(at::arange(12, at::kFloat) * 0.3 + k) * scale).reshape({3, 4}).to(m.scalar_type());
  }
};

bool bitwise_equal(const at::Tensor& x, const at::Tensor& y) {
  return x.scalar_type() == y.scalar_type() && at::equal(x, y);
}

TEST(MixedPrecisionOptimizer, LowPrecisionParamsGetFp32MainParamsInTheirLeafGroups) {
  Stack s;
  for (const char* name : {"layer.w", "layer.m"}) {
    SCOPED_TRACE(name);
    const at::Tensor& model = s.opt->chained().model_param(name);
    const at::Tensor& main = s.main(name);
    EXPECT_EQ(main.scalar_type(), at::kFloat);
    EXPECT_FALSE(main.is_same(model));
    EXPECT_NE(main.data_ptr(), model.data_ptr());
    EXPECT_TRUE(main.requires_grad());
    EXPECT_TRUE(bitwise_equal(main, model.detach().to(at::kFloat)));
    EXPECT_FALSE(s.opt->is_own_main_param(name));
  }
  // float32: the model param itself (same TensorImpl), no copy.
  EXPECT_TRUE(s.main("layer.b").is_same(s.b));
  EXPECT_TRUE(s.opt->is_own_main_param("layer.b"));
  // The leaves hold the main params now.
  EXPECT_TRUE(s.a->param_groups()[0].params()[0].is_same(s.main("layer.w")));
  EXPECT_TRUE(s.a->param_groups()[0].params()[1].is_same(s.b));
  EXPECT_TRUE(s.mu->param_groups()[0].params()[0].is_same(s.main("layer.m")));
  // Megatron's three lists, one entry per leaf group.
  ASSERT_EQ(s.opt->float16_groups().size(), 2u);
  ASSERT_EQ(s.opt->fp32_from_float16_groups().size(), 2u);
  ASSERT_EQ(s.opt->fp32_from_fp32_groups().size(), 2u);
  EXPECT_TRUE(s.opt->float16_groups()[0][0].is_same(s.w));
  EXPECT_TRUE(s.opt->fp32_from_float16_groups()[0][0].is_same(s.main("layer.w")));
  EXPECT_TRUE(s.opt->fp32_from_fp32_groups()[0][0].is_same(s.b));
  EXPECT_TRUE(s.opt->float16_groups()[1][0].is_same(s.m));
  EXPECT_TRUE(s.opt->fp32_from_fp32_groups()[1].empty());
  EXPECT_EQ(s.opt->low_precision_names(), (std::vector<std::string>{"layer.w", "layer.m"}));
  EXPECT_EQ(s.opt->chained().name_of(s.main("layer.m")), "layer.m");
  EXPECT_EQ(s.opt->loss_scale(), 1.0);  // bfloat16: no loss scaling
  EXPECT_EQ(s.opt->loss_scaler(), nullptr);
}

// fp32-main-params §2.1: both groups update their main params; after every step each bfloat16 model
// param equals its main param rounded to bfloat16.
TEST(MixedPrecisionOptimizer, ModelParamsEqualRoundedMainParamsAfterEveryStep) {
  Stack s;
  const at::Tensor w0 = s.main("layer.w").detach().to(at::kDouble).clone();
  const at::Tensor m0 = s.main("layer.m").detach().to(at::kDouble).clone();
  for (int step = 1; step <= 4; ++step) {
    SCOPED_TRACE(step);
    const at::Tensor w_main_before = s.main("layer.w").detach().clone();
    const at::Tensor m_main_before = s.main("layer.m").detach().clone();
    const at::Tensor b_before = s.b.detach().clone();
    s.set_grads(step);
    const at::Tensor w_grad = s.w.grad().to(at::kDouble);
    const at::Tensor m_grad = s.m.grad().to(at::kDouble);
    EXPECT_TRUE(s.opt->step());
    EXPECT_FALSE(at::equal(s.main("layer.w"), w_main_before));
    EXPECT_FALSE(at::equal(s.main("layer.m"), m_main_before));
    EXPECT_FALSE(at::equal(s.b, b_before));
    EXPECT_TRUE(bitwise_equal(s.w, s.main("layer.w").to(at::kBFloat16)));
    EXPECT_TRUE(bitwise_equal(s.m, s.main("layer.m").to(at::kBFloat16)));
    if (step == 1) {
      // buf = g: w = w0 - 0.1 g; m = m0 (1 - 0.05 * 0.1) - 0.05 g, computed here in double;
      // float32 rounding of the two operations: relative 1e-6.
      EXPECT_TRUE(at::allclose(s.main("layer.w").to(at::kDouble), w0 - 0.1 * w_grad, 1e-6, 1e-7));
      EXPECT_TRUE(
          at::allclose(s.main("layer.m").to(at::kDouble), m0 * 0.995 - 0.05 * m_grad, 1e-6, 1e-7));
    }
    s.opt->zero_grad();
  }
  // The low-precision model was never the optimizer's arithmetic: the main params carry bits
  // a bfloat16 round trip drops.
  EXPECT_FALSE(at::equal(s.main("layer.m"), s.m.to(at::kFloat)));
}

TEST(MixedPrecisionOptimizer, Float32ModelHasNoMainParamCopies) {
  Stack s(at::kFloat);
  for (const char* name : {"layer.w", "layer.b", "layer.m"}) {
    EXPECT_TRUE(s.opt->is_own_main_param(name)) << name;
    EXPECT_TRUE(s.main(name).is_same(s.opt->chained().model_param(name))) << name;
  }
  EXPECT_TRUE(s.opt->low_precision_names().empty());
  for (const auto& group : s.opt->fp32_from_float16_groups()) EXPECT_TRUE(group.empty());
  s.set_grads(1);
  s.opt->step();
  for (const auto& [key, tensor] : s.opt->state_dict()) {
    EXPECT_EQ(key.find("_mixed_precision_optimizer"), std::string::npos) << key;
  }
}

TEST(MixedPrecisionOptimizer, OtherDtypesAreRejectedByName) {
  at::Tensor w = at::zeros({2, 2}, at::kBFloat16).requires_grad_(true);
  at::Tensor d = at::zeros({2}, at::kDouble).requires_grad_(true);
  auto chain = std::make_unique<ChainedOptimizer>();
  chain->add_leaf(make_sgd({w, d}, 0.1), {{"ok.weight", w}, {"odd.scale", d}});
  try {
    MixedPrecisionOptimizer opt(std::move(chain));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("odd.scale"), std::string::npos) << message;
    EXPECT_NE(message.find("float64"), std::string::npos) << message;
  }
}

TEST(MixedPrecisionOptimizer, PrepareGradsPrefersMainGradOverGrad) {
  Stack s;
  s.w.mutable_grad() = at::full({2, 3}, 100.0f).to(at::kBFloat16);
  s.opt->main_grad("layer.w").fill_(2.0f);
  s.m.mutable_grad() = at::full({3, 4}, 0.1f).to(at::kBFloat16);  // no main_grad: .grad
  s.b.mutable_grad() = at::full({3}, 100.0f);
  s.opt->main_grad("layer.b").fill_(3.0f);
  s.opt->prepare_grads();

  EXPECT_TRUE(s.main("layer.w").grad().is_same(s.opt->main_grad("layer.w")));  // no copy
  EXPECT_TRUE(at::equal(s.main("layer.w").grad(), at::full({2, 3}, 2.0f)));
  EXPECT_TRUE(bitwise_equal(s.main("layer.m").grad(),
                            at::full({3, 4}, 0.1f).to(at::kBFloat16).to(at::kFloat)));
  EXPECT_FALSE(s.w.grad().defined());
  EXPECT_FALSE(s.m.grad().defined());
  EXPECT_TRUE(s.b.grad().is_same(s.opt->main_grad("layer.b")));
  EXPECT_EQ(s.opt->grads_for_clipping().size(), 3u);
  for (const auto& grad : s.opt->grads_for_clipping()) EXPECT_EQ(grad.scalar_type(), at::kFloat);
}

TEST(MixedPrecisionOptimizer, ZeroGradClearsGradsAndMainGrads) {
  Stack s;
  s.set_grads(1);
  s.opt->main_grad("layer.m").fill_(1.0f);
  s.opt->prepare_grads();
  s.b.mutable_grad() = at::ones({3});
  s.opt->zero_grad();
  for (const char* name : {"layer.w", "layer.b", "layer.m"}) {
    SCOPED_TRACE(name);
    EXPECT_FALSE(s.opt->chained().model_param(name).grad().defined());
    EXPECT_FALSE(s.main(name).grad().defined());
    EXPECT_FALSE(s.opt->chained().main_grad_if_defined(name).defined());
  }
  EXPECT_TRUE(s.opt->grads_for_clipping().empty());
}

TEST(MixedPrecisionOptimizer, AccumulatesMicroBatchGradsInFloat32) {
  Stack s;
  s.set_grads(1);
  const at::Tensor w1 = s.w.grad().clone(), m1 = s.m.grad().clone(), b1 = s.b.grad().clone();
  s.opt->accumulate_model_grads();
  EXPECT_FALSE(s.w.grad().defined());
  EXPECT_FALSE(s.b.grad().defined());
  s.set_grads(2);
  const at::Tensor w2 = s.w.grad().clone(), m2 = s.m.grad().clone(), b2 = s.b.grad().clone();
  s.opt->accumulate_model_grads();
  // The float32 sum of the widened grads (widening bfloat16 is exact): bitwise.
  EXPECT_TRUE(bitwise_equal(s.opt->main_grad("layer.w"), w1.to(at::kFloat) + w2.to(at::kFloat)));
  EXPECT_TRUE(bitwise_equal(s.opt->main_grad("layer.m"), m1.to(at::kFloat) + m2.to(at::kFloat)));
  EXPECT_TRUE(bitwise_equal(s.opt->main_grad("layer.b"), b1 + b2));
  // Not the bfloat16 sum: float32 keeps what bfloat16 accumulation would round off.
  EXPECT_FALSE(at::equal(s.opt->main_grad("layer.m"), (m1 + m2).to(at::kFloat)));
  s.opt->prepare_grads();
  EXPECT_TRUE(s.main("layer.w").grad().is_same(s.opt->main_grad("layer.w")));
}

// Micro-batch k's loss through the Stack's params, w used twice (its two gradient
// contributions meet in autograd before the one accumulation), b float32.
at::Tensor micro_batch_loss(const Stack& s, int k) {
  const at::Tensor x = at::sin(at::arange(8, at::kFloat) * (k + 1)).reshape({4, 2}).to(s.w.dtype());
  const at::Tensor h = at::matmul(x, s.w);
  const at::Tensor y = at::matmul(h + s.b.to(h.dtype()) + at::matmul(x * 0.5, s.w), s.m);
  return (y.to(at::kFloat) * y.to(at::kFloat)).sum();
}

TEST(MixedPrecisionOptimizer, AccumulatingInBackwardGivesTheSameMainGradBits) {
  Stack hooked, after;  // main_grad during backward / after it (accumulate_model_grads)
  hooked.opt->accumulate_model_grads_in_backward();
  for (int k = 0; k < 3; ++k) {
    micro_batch_loss(hooked, k).backward();
    // Consumed during backward: no 16-bit grad left; float32 params keep theirs in .grad.
    EXPECT_FALSE(hooked.w.grad().defined());
    EXPECT_FALSE(hooked.m.grad().defined());
    EXPECT_TRUE(hooked.b.grad().defined());
    hooked.opt->accumulate_model_grads();  // what the trainer calls: moves b's grad only
    micro_batch_loss(after, k).backward();
    EXPECT_TRUE(after.w.grad().defined());
    after.opt->accumulate_model_grads();
  }
  for (const char* name : {"layer.w", "layer.m", "layer.b"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(bitwise_equal(hooked.opt->main_grad(name), after.opt->main_grad(name)));
  }
  hooked.opt->prepare_grads();
  after.opt->prepare_grads();
  EXPECT_TRUE(hooked.opt->step());
  EXPECT_TRUE(after.opt->step());
  EXPECT_TRUE(bitwise_equal(hooked.w, after.w));
  EXPECT_TRUE(bitwise_equal(hooked.m, after.m));
  // The hooks go with the optimizer: a later backward leaves .grad as autograd does.
  hooked.opt.reset();
  micro_batch_loss(hooked, 0).backward();
  EXPECT_TRUE(hooked.w.grad().defined());
  EXPECT_TRUE(hooked.m.grad().defined());
}

TEST(MixedPrecisionOptimizer, ReloadModelParamsCopiesModelIntoMain) {
  Stack s;
  s.set_grads(1);
  s.opt->step();
  {
    c10::NoGradGuard no_grad;
    s.w.fill_(0.75);
    s.m.copy_(at::linspace(3, 4, 12).reshape({3, 4}));
  }
  const at::Tensor b_main = s.b.detach().clone();
  s.opt->reload_model_params();
  EXPECT_TRUE(bitwise_equal(s.main("layer.w"), s.w.to(at::kFloat)));
  EXPECT_TRUE(bitwise_equal(s.main("layer.m"), s.m.to(at::kFloat)));
  EXPECT_TRUE(at::equal(s.b, b_main));
}

TEST(MixedPrecisionOptimizer, Float16UsesDynamicLossScaling) {
  Stack s(at::kHalf, DynamicLossScalerOptions{8.0, 2.0, 0.5, 2, 1.0});
  ASSERT_NE(s.opt->loss_scaler(), nullptr);
  EXPECT_EQ(s.opt->loss_scale(), 8.0);
  // Grads of a loss scaled by 8; unscaling by a power of two is exact.
  const at::Tensor w0 = s.main("layer.w").detach().clone();
  s.set_grads(1, 8.0);
  const at::Tensor w_grad = s.w.grad().to(at::kFloat) / 8;
  EXPECT_TRUE(s.opt->step());
  EXPECT_TRUE(bitwise_equal(s.main("layer.w").grad(), w_grad));
  EXPECT_TRUE(bitwise_equal(s.main("layer.w"), w0 - w_grad * 0.1f));
  EXPECT_TRUE(bitwise_equal(s.w, s.main("layer.w").to(at::kHalf)));
  s.opt->zero_grad();

  // An overflow: step skipped, nothing updated, scale halved, counted.
  const at::Tensor w_before = s.w.detach().clone(), m_main = s.main("layer.m").detach().clone();
  const at::Tensor b_before = s.b.detach().clone();
  const int warnings = warning_count();
  s.set_grads(2, 8.0);
  s.m.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(s.opt->step());
  EXPECT_TRUE(at::equal(s.w, w_before));
  EXPECT_TRUE(at::equal(s.main("layer.m"), m_main));
  EXPECT_TRUE(at::equal(s.b, b_before));
  EXPECT_EQ(s.opt->loss_scale(), 4.0);
  EXPECT_EQ(s.opt->skipped_steps(), 1);
  EXPECT_EQ(warning_count(), warnings + 1);
  s.opt->zero_grad();

  // growth_interval 2: the second clean step after the overflow doubles the scale.
  for (int k = 3; k <= 4; ++k) {
    s.set_grads(k, s.opt->loss_scale());
    EXPECT_TRUE(s.opt->step());
    s.opt->zero_grad();
  }
  EXPECT_EQ(s.opt->loss_scale(), 8.0);
  EXPECT_EQ(s.opt->skipped_steps(), 1);
}

NamedTensors cloned(const NamedTensors& state) {
  NamedTensors copy;
  for (const auto& [key, tensor] : state) copy.emplace_back(key, tensor.clone());
  return copy;
}

NamedTensors without(const NamedTensors& state, const std::string& fragment) {
  NamedTensors kept;
  for (const auto& entry : state) {
    if (entry.first.find(fragment) == std::string::npos) kept.push_back(entry);
  }
  return kept;
}

// The saving run (3 steps) and a fresh optimizer whose model was just loaded from it, as the
// checkpoint loader does before wrapper.load_state_dict (fp32-main-params §9.3).
struct SavedAndRestored {
  Stack saved;
  Stack restored;
  NamedTensors state;
  SavedAndRestored() {
    for (int k = 1; k <= 3; ++k) {
      saved.set_grads(k);
      saved.opt->step();
      saved.opt->zero_grad();
    }
    state = cloned(saved.opt->state_dict());
    c10::NoGradGuard no_grad;
    restored.w.copy_(saved.w);
    restored.b.copy_(saved.b);
    restored.m.copy_(saved.m);
  }
};

TEST(MixedPrecisionOptimizer, StateDictAddsMainParamsOfLowPrecisionParamsOnly) {
  SavedAndRestored t;
  std::vector<std::string> main_keys;
  for (const auto& [key, tensor] : t.state) {
    if (key.rfind(kMainParamPrefix, 0) == 0) {
      main_keys.push_back(key);
      EXPECT_EQ(tensor.scalar_type(), at::kFloat);
    }
  }
  EXPECT_EQ(main_keys, (std::vector<std::string>{
                           "optimizer._mixed_precision_optimizer.fp32_from_fp16_params.layer.w",
                           "optimizer._mixed_precision_optimizer.fp32_from_fp16_params.layer.m"}));
  EXPECT_EQ(t.state.size(), 3u * 2 + 2);  // (momentum_buffer, step) x 3 params + 2 mains
}

TEST(MixedPrecisionOptimizer, LoadWithAllMainParamsRestoresThemExactly) {
  SavedAndRestored t;
  // The saved main params hold bits the bfloat16 model cannot: a restore through the model
  // would lose them.
  ASSERT_FALSE(at::equal(t.saved.main("layer.m"), t.saved.m.to(at::kFloat)));
  const int warnings = warning_count();
  t.restored.opt->load_state_dict(t.state);
  EXPECT_EQ(warning_count(), warnings);
  for (const char* name : {"layer.w", "layer.m"}) {
    EXPECT_TRUE(bitwise_equal(t.restored.main(name), t.saved.main(name))) << name;
  }
  // The loaded model params were not overwritten by the state-creating probe step.
  EXPECT_TRUE(bitwise_equal(t.restored.w, t.saved.w));
  EXPECT_TRUE(bitwise_equal(t.restored.m, t.saved.m));
  // The next step is the continuous run's next step.
  for (Stack* s : {&t.saved, &t.restored}) {
    s->set_grads(4);
    s->opt->step();
  }
  for (const char* name : {"layer.w", "layer.b", "layer.m"}) {
    EXPECT_TRUE(bitwise_equal(t.restored.main(name), t.saved.main(name))) << name;
  }
  EXPECT_TRUE(bitwise_equal(t.restored.m, t.saved.m));
}

TEST(MixedPrecisionOptimizer, LoadWithoutMainParamsRebuildsThemFromTheModelAndWarns) {
  SavedAndRestored t;
  const int warnings = warning_count();
  t.restored.opt->load_state_dict(without(t.state, "_mixed_precision_optimizer"));
  EXPECT_EQ(warning_count(), warnings + 1);
  EXPECT_TRUE(bitwise_equal(t.restored.main("layer.w"), t.saved.w.to(at::kFloat)));
  EXPECT_TRUE(bitwise_equal(t.restored.main("layer.m"), t.saved.m.to(at::kFloat)));
  // The leaves' state is restored all the same.
  const auto restored_state = t.restored.opt->state_dict();
  for (const auto& [key, tensor] : without(t.state, "_mixed_precision_optimizer")) {
    bool found = false;
    for (const auto& [other_key, other] : restored_state) {
      if (other_key == key) found = at::equal(other, tensor);
    }
    EXPECT_TRUE(found) << key;
  }
}

TEST(MixedPrecisionOptimizer, LoadWithSomeMainParamsFailsListingTheMissingAndChangesNothing) {
  SavedAndRestored t;
  const at::Tensor w_main = t.restored.main("layer.w").detach().clone();
  const at::Tensor m_main = t.restored.main("layer.m").detach().clone();
  const at::Tensor m_model = t.restored.m.detach().clone();
  const NamedTensors partial = without(t.state, "fp32_from_fp16_params.layer.m");
  try {
    t.restored.opt->load_state_dict(partial);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("1 of 2"), std::string::npos) << message;
    EXPECT_NE(message.find("missing: layer.m"), std::string::npos) << message;
  }
  EXPECT_TRUE(t.restored.opt->state_dict().size() == 2u);  // only the two main params
  EXPECT_TRUE(at::equal(t.restored.main("layer.w"), w_main));
  EXPECT_TRUE(at::equal(t.restored.main("layer.m"), m_main));
  EXPECT_TRUE(at::equal(t.restored.m, m_model));
}

TEST(MixedPrecisionOptimizer, LoadRejectsBadMainParamEntries) {
  SavedAndRestored t;
  NamedTensors bad;
  for (const auto& [key, tensor] : t.state) {
    bad.emplace_back(key, key == std::string(kMainParamPrefix) + "layer.w"
                              ? tensor.to(at::kBFloat16)  // must be float32
                              : tensor);
  }
  bad.emplace_back(std::string(kMainParamPrefix) + "layer.b", t.saved.b.detach().clone());
  try {
    t.restored.opt->load_state_dict(bad);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("layer.w: dtype bfloat16, expected float32"), std::string::npos)
        << message;
    EXPECT_NE(message.find("fp32_from_fp16_params.layer.b ('layer.b' is float32"),
              std::string::npos)
        << message;
  }
  EXPECT_EQ(t.restored.opt->state_dict().size(), 2u);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
