// One training step of the tiny model (configs/qwen2_moe_tiny.yaml: bfloat16 model, fp32 main
// params, Muon + AdamW, grad clipping) against an oracle written here from plain LibTorch ops.
//
// The trainer's step (trainer.h): per micro-batch, forward, cross-entropy + coef * router aux
// loss, backward of loss / accumulation_steps into bfloat16 grads that are added to float32
// main_grads; then the global L2 grad norm and clipping (torch.nn.utils.clip_grad_norm_); then
// AdamW and Muon update the float32 main params, and the bfloat16 model params become the main
// params rounded to nearest even. Only the forward uses the model's own module (a second
// instance holding the same weights); the loss, the accumulation, the norm, the clip, the
// routing and both updates are written below from their documented formulas (optim/adamw.h =
// torch.optim.AdamW; optim/muon.h, optim/newton_schulz.h, optim/routing.h, docs/config.md), the
// scalar arithmetic and Newton-Schulz in float64.
//
// The comparison is split so each tolerance has one cause: the oracle's loss and clipped grads
// against the trainer's; then the oracle's optimizer update, fed the trainer's clipped grads
// (just shown equal to the oracle's within the grad tolerance) and the main params from before
// the step, against the trainer's updated main params and model params.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "mixtrain/data/dataset.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/model/init_dtype.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/muon_config.h"
#include "mixtrain/trainer/trainer.h"
#include "support/trainer_probe.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using Tensors = std::map<std::string, at::Tensor>;

// ---- the oracle -----------------------------------------------------------------------------

// Mean next-token cross-entropy of logits [batch, seq, vocab] against labels [batch, seq]:
// -mean(log_softmax(logits)[label]), in float32 like the trainer.
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& labels) {
  const at::Tensor log_probs = at::log_softmax(logits.to(at::kFloat), -1);
  return -log_probs.gather(-1, labels.unsqueeze(-1)).mean();
}

struct OracleGrads {
  double loss = 0;     // mean over micro-batches of cross-entropy + coef * aux
  double norm = 0;     // global L2 norm of the float32 grads, before clipping
  Tensors clipped;     // float64: the float32 accumulated grads times the clip coefficient
  double coefficient;  // min(1, max_norm / (norm + 1e-6))
};

// Forward/backward over the step's micro-batches with `model` (holding the trainer's weights)
// and a data stream of its own, built like the trainer's (rank 0 of 1).
OracleGrads oracle_grads(CausalLM& model, const TrainerConfig& config) {
  const int64_t micro_batches = config.data.global_batch_size / config.data.micro_batch_size;
  std::unique_ptr<TokenDataset> data =
      make_dataset(config.data, config.model.vocab_size, config.train.seed, 0, 1);
  OracleGrads out;
  Tensors accumulated;  // float32 main_grad: the exactly widened bfloat16 grads, summed
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    const Batch batch = data->next_batch(config.data.micro_batch_size, config.data.seq_len);
    for (auto& param : model.parameters()) param.mutable_grad().reset();
    const CausalLMOutput output = model.forward(batch.input_ids);
    const at::Tensor loss = cross_entropy(output.logits, batch.labels) +
                            moe_config(config.model).router_aux_loss_coef * output.aux_loss;
    (loss * (1.0 / static_cast<double>(micro_batches))).backward();
    out.loss += loss.item<double>() / static_cast<double>(micro_batches);
    for (const auto& item : model.named_parameters()) {
      const at::Tensor grad = item.value().grad().to(at::kFloat);
      auto [it, fresh] = accumulated.emplace(item.key(), grad);
      if (!fresh) it->second = it->second + grad;
    }
  }
  double squares = 0;
  for (const auto& [name, grad] : accumulated)
    squares += grad.to(at::kDouble).pow(2).sum().item<double>();
  out.norm = std::sqrt(squares);
  out.coefficient = std::min(1.0, config.train.max_grad_norm / (out.norm + 1e-6));
  for (const auto& [name, grad] : accumulated) {
    out.clipped[name] = grad.to(at::kDouble) * out.coefficient;
  }
  return out;
}

// optim/routing.h, yaml dialect: Muon iff ndim >= 2 and the lower-cased name contains none of
// embed, lm_head, out_head, out_proj.bias. AdamW weight decay 0 for names containing bias, norm
// or ln_ (optim/param_groups.h).
bool routes_to_muon(const std::string& name, int64_t ndim) {
  if (ndim < 2) return false;
  for (const char* keyword : {"embed", "lm_head", "out_head", "out_proj.bias"}) {
    if (name.find(keyword) != std::string::npos) return false;
  }
  return true;
}
bool no_decay(const std::string& name) {
  for (const char* keyword : {"bias", "norm", "ln_"}) {
    if (name.find(keyword) != std::string::npos) return true;
  }
  return false;
}

// torch.optim.AdamW's first step (t = 1, zero moments), float64:
//   p <- p (1 - lr wd);  m = (1 - b1) g;  v = (1 - b2) g^2
//   p <- p - lr / (1 - b1) * m / (sqrt(v) / sqrt(1 - b2) + eps)
at::Tensor adamw_first_step(const at::Tensor& p, const at::Tensor& g,
                            const torch::optim::AdamWOptions& c, double weight_decay) {
  const double b1 = std::get<0>(c.betas()), b2 = std::get<1>(c.betas());
  const at::Tensor m = (1 - b1) * g;
  const at::Tensor v = (1 - b2) * g * g;
  const at::Tensor denom = v.sqrt() / std::sqrt(1 - b2) + c.eps();
  return p * (1 - c.lr() * weight_decay) - (c.lr() / (1 - b1)) * m / denom;
}

// The asym5 Newton-Schulz schedule (docs/architecture.md §5: five per-step triples).
const std::vector<std::array<double, 3>> kAsym5 = {{4.0848, -6.8946, 2.9270},
                                                   {3.9505, -6.3029, 2.6377},
                                                   {3.7418, -5.5913, 2.3037},
                                                   {2.8769, -3.1427, 1.2046},
                                                   {2.8366, -3.0525, 1.2012}};

// Rounds float64 `t` to `dtype` and back: where the documented computation stores a result.
at::Tensor rounded(const at::Tensor& t, c10::ScalarType dtype) {
  return t.to(dtype).to(at::kDouble);
}

// U V^T of every [A, B] matrix of u (last two dims), approximately, as newton_schulz.h
// documents it: in `dtype` (each named result below rounded to it, the arithmetic in float64),
// on the wide side (transpose when A > B); X = X / (||X||_F + eps); per (a, b, c):
// G = X X^T, X = a X + (b G + c G G) X.
at::Tensor newton_schulz(const at::Tensor& u, double eps, c10::ScalarType dtype) {
  const int64_t rows = u.size(-2), cols = u.size(-1);
  at::Tensor x = rounded(u.to(at::kDouble).reshape({-1, rows, cols}), dtype);
  if (rows > cols) x = x.transpose(1, 2);
  const at::Tensor norm = rounded(x.flatten(1).norm(2, 1).view({-1, 1, 1}), dtype);
  x = rounded(x / (norm + eps), dtype);
  for (const auto& [a, b, c] : kAsym5) {
    const at::Tensor gram = rounded(at::matmul(x, x.transpose(1, 2)), dtype);
    const at::Tensor poly = rounded(b * gram + c * at::matmul(gram, gram), dtype);
    x = rounded(a * x + at::matmul(poly, x), dtype);
  }
  if (rows > cols) x = x.transpose(1, 2);
  return x.reshape(u.sizes());
}

// Muon's first step, float64 (Newton-Schulz in ns_dtype): momentum (sum style) buf = g,
// Nesterov u = g + mu * buf; O = newton_schulz(u); p <- p (1 - lr wd) - lr * scale * O with
// scale (match_rms_adamw) = matched_adamw_rms * sqrt(max(A, B)). `update` gets lr * scale * O.
at::Tensor muon_first_step(const at::Tensor& p, const at::Tensor& g, const MuonOptions& c,
                           at::Tensor* update) {
  const at::Tensor u = g + c.momentum() * g;
  const at::Tensor o = newton_schulz(u, c.ns_epsilon(), c.ns_dtype());
  const double scale =
      c.matched_adamw_rms() * std::sqrt(static_cast<double>(std::max(p.size(-2), p.size(-1))));
  *update = c.lr() * scale * o;
  return p * (1 - c.lr() * c.weight_decay()) - *update;
}

// ---- the trainer's step, recorded -----------------------------------------------------------

struct Recorded {
  StepResult result;
  Tensors main_before, grads, main_after, model_after;
  std::map<std::string, std::string> kind;  // "adamw" / "muon", the trainer's routing
};

// max over elements of |actual - expected| / bound (<= 1 passes).
double worst_ratio(const at::Tensor& actual, const at::Tensor& expected, const at::Tensor& bound) {
  return ((actual.to(at::kDouble) - expected.to(at::kDouble)).abs() / bound).max().item<double>();
}

// How close the trainer's Muon update must be to the oracle's (see each TEST).
struct MuonTolerance {
  bool per_element;  // true: every element within `of_update` x max |update|;
                     // false: the Frobenius norm of the difference within `of_update` x
                     // the update's Frobenius norm
  double of_update;
};

void run_one_step_against_the_oracle(const std::vector<std::string>& overrides,
                                     MuonTolerance muon_tolerance) {
  const ResolvedConfig resolved = test_support::checkpoint_test_config(overrides);
  const TrainerConfig& config = resolved.config;
  // What the oracle implements; anything else configured would make it a different oracle.
  ASSERT_EQ(config.optimizer.target, "Muon");
  ASSERT_EQ(config.optimizer.routing, "yaml");
  ASSERT_TRUE(config.optimizer.fp32_main_params);
  ASSERT_EQ(muon_config(config).options.ns_variant(), "asym5");
  ASSERT_EQ(muon_config(config).options.ns_steps(), 5);
  ASSERT_EQ(muon_config(config).options.momentum_style(), MomentumStyle::kSum);
  ASSERT_TRUE(muon_config(config).options.nesterov());
  ASSERT_EQ(muon_config(config).options.adjust_lr_fn(), AdjustLrFn::kMatchRmsAdamw);
  ASSERT_TRUE(muon_config(config).adamw_keywords.empty());

  Trainer trainer(resolved, make_single_process_mesh(),
                  std::filesystem::temp_directory_path().string());
  ChainedOptimizer& chained = trainer.optimizer().chained();
  Recorded rec;
  for (const auto& name : chained.names()) {
    rec.main_before[name] = chained.optimizer_param(name).detach().clone();
    rec.kind[name] = chained.leaf_of(name).kind();
    ASSERT_EQ(chained.model_param(name).scalar_type(), at::kBFloat16) << name;
  }
  // The oracle's model: a second instance holding the trainer's (bfloat16) weights.
  std::shared_ptr<CausalLM> reference = build_model(config.model, config.train.seed);
  apply_model_init_dtype(*reference, at::kBFloat16);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : reference->named_parameters()) {
      ASSERT_TRUE(chained.contains(item.key())) << item.key();
      item.value().copy_(chained.model_param(item.key()));
    }
  }

  rec.result = trainer.compute_gradients();
  for (const auto& name : chained.names()) {
    rec.grads[name] = chained.optimizer_param(name).grad().clone();
  }
  trainer.apply_update();
  for (const auto& name : chained.names()) {
    rec.main_after[name] = chained.optimizer_param(name).detach().clone();
    rec.model_after[name] = chained.model_param(name).detach().clone();
  }

  const OracleGrads oracle = oracle_grads(*reference, config);
  // Constant schedule without warm-up: step 1 runs at the configured lrs.
  ASSERT_DOUBLE_EQ(rec.result.lr, adamw_config(config).lr());
  // Loss: the same bfloat16 forward; only the float32 cross-entropy is computed by other ops
  // (log_softmax + gather vs cross_entropy): a few float32 ulps, 1e-6 relative is ~10x that.
  EXPECT_NEAR(rec.result.loss, oracle.loss, 1e-6 * oracle.loss);
  // Norm: float64 sums, in another order, of float32 grads that agree but for the rare
  // bfloat16 flips described below, each of which moves the norm by far less than 1e-6.
  EXPECT_NEAR(rec.result.grad_norm, oracle.norm, 1e-6 * oracle.norm);
  // The configured max_grad_norm must actually clip here, or the clip would go untested.
  ASSERT_LT(oracle.coefficient, 1.0) << "grad norm " << oracle.norm << " does not clip";

  ASSERT_EQ(rec.grads.size(), oracle.clipped.size());
  for (const auto& [name, grad] : rec.grads) {
    ASSERT_TRUE(oracle.clipped.count(name)) << name;
    // Routing: the oracle's rule must send each parameter where the trainer did.
    EXPECT_EQ(rec.kind[name], routes_to_muon(name, grad.dim()) ? "muon" : "adamw") << name;
    // The same bfloat16 backward kernels; a float32 cross-entropy gradient that differs in its
    // last bit can flip a bfloat16 rounding (2^-8 relative) of a logit grad, which the
    // backward then spreads: 1e-3 of the tensor's largest grad, plus float32 rounding of the
    // clip product (2^-24 relative per element).
    const at::Tensor& want = oracle.clipped.at(name);
    const double scale = std::max(want.abs().max().item<double>(), 1e-30);
    const at::Tensor bound = 1e-3 * scale + want.abs() * std::ldexp(1.0, -23) + 1e-30;
    EXPECT_LE(worst_ratio(grad, want, bound), 1.0)
        << name << ": relative difference " << test_support::relative_difference(grad, want);
  }

  // The optimizer step, from the trainer's clipped grads and the main params before the step.
  for (const auto& [name, grad] : rec.grads) {
    const at::Tensor p = rec.main_before.at(name).to(at::kDouble);
    const at::Tensor g = grad.to(at::kDouble);
    const at::Tensor& main = rec.main_after.at(name);
    at::Tensor want, bound;
    if (rec.kind[name] == "muon") {
      at::Tensor update;
      want = muon_first_step(p, g, muon_config(config).options, &update);
      // float32 rounding of p's update (2^-23 relative, twice), plus the Newton-Schulz
      // difference (rounding amplified by the iteration): muon_tolerance.
      const at::Tensor rounding = p.abs() * std::ldexp(1.0, -22) + 1e-30;
      if (muon_tolerance.per_element) {
        bound = rounding + muon_tolerance.of_update * update.abs().max().item<double>();
      } else {
        const double off = (main.to(at::kDouble) - want).norm().item<double>();
        const double allowed = muon_tolerance.of_update * update.norm().item<double>() +
                               rounding.norm().item<double>();
        EXPECT_LE(off, allowed) << name << " (muon): ||main - oracle||_F " << off << " > "
                                << allowed << ", update " << update.norm().item<double>();
      }
    } else {
      const double wd = no_decay(name) ? 0.0 : adamw_config(config).weight_decay();
      want = adamw_first_step(p, g, adamw_config(config), wd);
      // A float32 pass of six operations: 4 float32 ulps (2^-21 relative) of p and of the
      // update, which is at most lr at step 1 (m / denom = (1 - b1) g / (|g| + eps)).
      bound = (p.abs() + adamw_config(config).lr()) * std::ldexp(1.0, -21) + 1e-30;
    }
    if (bound.defined()) {
      EXPECT_LE(worst_ratio(main, want, bound), 1.0)
          << name << " (" << rec.kind[name] << "): main param off by "
          << test_support::relative_difference(main, want) << " (relative)";
      // ... and the bfloat16 model param, main rounded, within half a bfloat16 ulp (2^-8
      // relative: 8 significant bits) more.
      EXPECT_LE(
          worst_ratio(rec.model_after.at(name), want, want.abs() * std::ldexp(1.0, -8) + bound),
          1.0)
          << name;
    }
    // The copy-back: the model param is the main param rounded to nearest even (Tensor::to).
    EXPECT_TRUE(rec.model_after.at(name).equal(main.to(at::kBFloat16))) << name;
    // The step changed the parameter (a zero update would make the comparison empty).
    EXPECT_FALSE(main.equal(rec.main_before.at(name))) << name;
  }
}

// Newton-Schulz in float32 (the oracle rounds to float32 where newton_schulz.h stores a
// result): the trainer's fused GEMMs round differently, by float32 eps (1.2e-7) relative, and
// five polynomial steps with coefficients up to 6.9 amplify that; 1e-4 of the largest update
// element bounds it with room.
TEST(OneStepOracle, MuonWithFloat32NewtonSchulzAndAdamW) {
  run_one_step_against_the_oracle({"optimizer.muon_config.muon_ns_dtype=float32",
                                   // Exercise Muon's decoupled weight decay too (0 in the §1
                                   // config would leave that term untested).
                                   "optimizer.muon_config.muon_weight_decay=0.1"},
                                  {/*per_element=*/true, 1e-4});
}

// The fp32-main-params §1 configuration as is, Newton-Schulz in bfloat16 (the oracle rounds to
// bfloat16 at the same points). A 2^-8 rounding difference in a direction where the momentum has a
// tiny singular value is multiplied by about a (~4) per step, so it reaches the order of the update
// there: the router gate's gradient is nearly rank-deficient (the softmax's gradient sums to
// about 0 over the experts). Hence a coarse check, on the whole tensor: the difference's
// Frobenius norm at most half the update's. A wrong sign, scale, transpose or schedule is off
// by the order of the whole update; the float32 test above is the precise one.
TEST(OneStepOracle, RfcConfigWithBfloat16NewtonSchulz) {
  run_one_step_against_the_oracle({}, {/*per_element=*/false, 0.5});
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
