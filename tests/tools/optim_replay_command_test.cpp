// `mixtrain optim-replay`: the optimizer stack on given params and float32 grads, checked
// against the formulas evaluated independently here in double precision.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include "mixtrain/core/safetensors.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

constexpr const char* kMixedPrecision = R"(
fsdp_config:
  mix_precision:
    param_dtype: bfloat16
    reduce_dtype: float32
train:
  max_grad_norm: 0.0
)";

std::map<std::string, at::Tensor> as_map(const NamedTensors& tensors) {
  return {tensors.begin(), tensors.end()};
}

class OptimReplay : public ::testing::Test {
 protected:
  void write_config(const std::string& optimizer_yaml) {
    std::ofstream(dir_.file("c.yaml")) << optimizer_yaml << kMixedPrecision;
  }
  CommandResult replay() {
    return run_mixtrain("optim-replay --config " + dir_.file("c.yaml") + " --params " +
                        dir_.file("p.safetensors") + " --grads " + dir_.file("g.safetensors") +
                        " --out " + dir_.file("o.safetensors"));
  }
  // w: bfloat16 [2, 3] (gets an fp32 main param), b: float32 [3] (its own main param).
  void write_inputs(int64_t steps) {
    w_ = at::tensor({0.5, -1.25, 2.0, 0.1, 3.0, -0.7}, at::kDouble)
             .reshape({2, 3})
             .to(at::kBFloat16);
    b_ = at::tensor({0.3, -0.2, 0.05}, at::kFloat);
    write_safetensors(dir_.file("p.safetensors"), {{"layer.w", w_}, {"layer.bias", b_}});
    NamedTensors grads;
    for (int64_t k = 1; k <= steps; ++k) {
      grads.emplace_back("step." + std::to_string(k) + ".layer.w",
                         at::linspace(-0.3 * k, 0.5, 6, at::kFloat).reshape({2, 3}));
      grads.emplace_back("step." + std::to_string(k) + ".layer.bias",
                         at::tensor({0.01f * k, -0.02f, 0.5f}));
    }
    write_safetensors(dir_.file("g.safetensors"), grads);
    grads_ = as_map(grads);
  }
  at::Tensor grad(int64_t k, const std::string& name) {
    return grads_.at("step." + std::to_string(k) + "." + name).to(at::kDouble);
  }
  void expect_rejected(const std::string& fragment) {
    CommandResult r = replay();
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(fragment), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir_.file("o.safetensors")));
  }

  TempDir dir_;
  at::Tensor w_, b_;
  std::map<std::string, at::Tensor> grads_;
};

// torch.optim.AdamW in double: the independent reference for the replayed float32 numbers.
struct AdamWReference {
  at::Tensor p, m, v;
  void step(const at::Tensor& g, int64_t t, double lr, double wd) {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    p = p * (1 - lr * wd);
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    p = p - lr / (1 - std::pow(b1, t)) * m / ((v / (1 - std::pow(b2, t))).sqrt() + eps);
  }
};

TEST_F(OptimReplay, AdamWWithMainParamsMatchesTheFormula) {
  write_config("optimizer:\n  _target_: AdamW\n  fp32_main_params: true\n");
  write_inputs(2);
  CommandResult r = replay();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto out = as_map(read_safetensors(dir_.file("o.safetensors")).tensors);

  // Defaults (docs/architecture.md §5): lr 1e-3, wd 0.01, but "bias" names get no weight decay.
  AdamWReference w{w_.to(at::kDouble), at::zeros({2, 3}, at::kDouble),
                   at::zeros({2, 3}, at::kDouble)};
  AdamWReference b{b_.to(at::kDouble), at::zeros({3}, at::kDouble), at::zeros({3}, at::kDouble)};
  for (int64_t k = 1; k <= 2; ++k) {
    w.step(grad(k, "layer.w"), k, 1e-3, 0.01);
    b.step(grad(k, "layer.bias"), k, 1e-3, 0.0);
  }
  const std::string main_key = "optimizer._mixed_precision_optimizer.fp32_from_fp16_params.";
  ASSERT_TRUE(out.count(main_key + "layer.w"));
  EXPECT_FALSE(out.count(main_key + "layer.bias")) << "float32 params are their own main param";
  const at::Tensor main_w = out.at(main_key + "layer.w");
  EXPECT_EQ(main_w.scalar_type(), at::kFloat);
  // float32 arithmetic vs double: each op rounds at 6e-8 relative; a few ops on values <= 3.
  EXPECT_TRUE(at::allclose(main_w.to(at::kDouble), w.p, 1e-6, 1e-6)) << main_w << w.p;
  EXPECT_TRUE(at::equal(out.at("model.layer.w"), main_w.to(at::kBFloat16)))
      << "the bfloat16 model param is its main param rounded to nearest even";
  EXPECT_EQ(out.at("model.layer.w").scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::allclose(out.at("model.layer.bias").to(at::kDouble), b.p, 1e-6, 1e-6));
  EXPECT_TRUE(
      at::allclose(out.at("optimizer.state.layer.w.exp_avg").to(at::kDouble), w.m, 1e-6, 1e-9));
  EXPECT_TRUE(
      at::allclose(out.at("optimizer.state.layer.w.exp_avg_sq").to(at::kDouble), w.v, 1e-6, 1e-12));
  EXPECT_TRUE(
      at::allclose(out.at("optimizer.state.layer.bias.exp_avg").to(at::kDouble), b.m, 1e-6, 1e-9));
}

TEST_F(OptimReplay, MuonMomentumAndCopyBack) {
  write_config(
      "optimizer:\n  _target_: Muon\n  fp32_main_params: true\n  muon_config:\n"
      "    muon_momentum: 0.5\n    muon_momentum_style: sum\n");
  write_inputs(3);
  CommandResult r = replay();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto out = as_map(read_safetensors(dir_.file("o.safetensors")).tensors);
  // sum form: buf = mu * buf + g, by hand over three steps.
  at::Tensor buf = at::zeros({2, 3}, at::kDouble);
  for (int64_t k = 1; k <= 3; ++k) buf = 0.5 * buf + grad(k, "layer.w");
  const at::Tensor momentum = out.at("optimizer.state.layer.w.momentum_buffer");
  EXPECT_TRUE(at::allclose(momentum.to(at::kDouble), buf, 1e-6, 1e-7)) << momentum << buf;
  EXPECT_TRUE(at::equal(out.at("model.layer.w"),
                        out.at("optimizer._mixed_precision_optimizer.fp32_from_fp16_params.layer.w")
                            .to(at::kBFloat16)));
  // The 1-D bias went to AdamW.
  EXPECT_TRUE(out.count("optimizer.state.layer.bias.exp_avg_sq"));
  EXPECT_FALSE(out.count("optimizer.state.layer.bias.momentum_buffer"));
}

TEST_F(OptimReplay, BadGradientFilesAreRefusedAndNothingIsWritten) {
  write_config("optimizer:\n  _target_: AdamW\n  fp32_main_params: true\n");
  write_inputs(1);
  auto grads_with = [&](NamedTensors grads) {
    write_safetensors(dir_.file("g.safetensors"), grads);
  };
  const at::Tensor gw = at::zeros({2, 3}), gb = at::zeros({3});

  grads_with({{"step.1.layer.w", gw}});
  expect_rejected("step.1.layer.bias: gradient missing");
  grads_with({{"step.1.layer.w", gw}, {"step.1.layer.bias", gb}, {"step.1.layer.x", gb}});
  expect_rejected("step.1.layer.x: no parameter named layer.x");
  grads_with({{"step.1.layer.w", at::zeros({3, 2})}, {"step.1.layer.bias", gb}});
  expect_rejected("step.1.layer.w: shape [3, 2] differs");
  grads_with({{"step.1.layer.w", gw.to(at::kBFloat16)}, {"step.1.layer.bias", gb}});
  expect_rejected("gradients must be float32");
  grads_with({{"step.1.layer.w", gw},
              {"step.1.layer.bias", gb},
              {"step.3.layer.w", gw},
              {"step.3.layer.bias", gb}});
  expect_rejected("step.2.*: step missing");
  grads_with({{"grad.layer.w", gw}});
  expect_rejected("grad.layer.w: expected a key step.<k>.<name>");
  write_safetensors(dir_.file("p.safetensors"), {{"layer.w", at::zeros({2, 3}, at::kLong)}});
  expect_rejected("layer.w: dtype int64 is not a parameter dtype");
  std::ofstream(dir_.file("p.safetensors")) << "garbage";
  expect_rejected(dir_.file("p.safetensors"));
}

// float16 params get dynamic loss scaling (2^16): the replay must feed the grads scaled as a
// scaled backward would, so the result equals the unscaled AdamW formula.
TEST_F(OptimReplay, Float16ParamsWithLossScalingMatchTheFormula) {
  write_config("optimizer:\n  _target_: AdamW\n  fp32_main_params: true\n");
  const at::Tensor w = at::tensor({0.5, -0.25, 1.0, 2.0}, at::kDouble).to(at::kHalf);
  const at::Tensor g = at::tensor({0.125f, -0.5f, 0.0f, 1.0f});
  write_safetensors(dir_.file("p.safetensors"), {{"w", w}});
  write_safetensors(dir_.file("g.safetensors"), {{"step.1.w", g}});
  CommandResult r = replay();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto out = as_map(read_safetensors(dir_.file("o.safetensors")).tensors);
  AdamWReference ref{w.to(at::kDouble), at::zeros({4}, at::kDouble), at::zeros({4}, at::kDouble)};
  ref.step(g.to(at::kDouble), 1, 1e-3, 0.01);
  const at::Tensor main = out.at("optimizer._mixed_precision_optimizer.fp32_from_fp16_params.w");
  EXPECT_TRUE(at::allclose(main.to(at::kDouble), ref.p, 1e-6, 1e-6)) << main << ref.p;
  EXPECT_TRUE(at::equal(out.at("model.w"), main.to(at::kHalf)));
}

TEST_F(OptimReplay, Float16ParamsWithoutMainParamsIsAConfigError) {
  write_config("optimizer:\n  _target_: AdamW\n  fp32_main_params: false\n");
  write_safetensors(dir_.file("p.safetensors"), {{"w", at::zeros({2, 2}, at::kHalf)}});
  write_safetensors(dir_.file("g.safetensors"), {{"step.1.w", at::zeros({2, 2})}});
  CommandResult r = replay();
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_.file("o.safetensors")));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
