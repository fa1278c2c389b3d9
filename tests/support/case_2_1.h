// fp32-main-params §2.1 on real ranks (tests/support/multiprocess.h), shared by fsdp_test and
// expert_parallel_test: the tiny Qwen2-MoE in bfloat16 with fp32 main params, sharded over the
// mesh, against a one-process reference that takes the same global batch as data-parallel
// micro-batches accumulated in rank order (loss / dp). build_case_2_1 makes both stacks;
// compare_case_2_1_steps steps both and EXPECTs, per step, main_grad, loss, the clipped grad norm
// and the main params within the step's tolerances; run_and_report runs such a worker.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/functional.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/fsdp.h"
#include "mixtrain/distributed/parallelize.h"
#include "mixtrain/model/init_dtype.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/qwen2_moe.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/grad_clip.h"
#include "mixtrain/optim/mixed_precision_optimizer.h"
#include "support/multiprocess.h"
#include "support/tiny_model_config.h"

namespace mixtrain::test_support {

// fp32-main-params §2.1: bfloat16 model, fp32 main params, param/output bfloat16, reduce float32.
inline TrainerConfig rfc_config(const std::string& target) {
  TrainerConfig config;
  config.model = tiny_config();
  config.model_init_dtype = "bfloat16";
  config.optimizer.target = target;
  config.optimizer.fp32_main_params = true;
  adamw_config(config).lr(1e-2);  // large enough that every step moves the bf16 params
  config.mix_precision.param_dtype = "bfloat16";
  config.mix_precision.reduce_dtype = "float32";
  config.mix_precision.output_dtype = "bfloat16";
  config.train.max_grad_norm = 0.5;  // below the tiny model's norm: clipping is exercised
  return config;
}

// Step `step`'s token ids, [batch, seq], the same on every rank.
inline torch::Tensor ids_for_step(const ModelConfig& c, int64_t step, int64_t batch, int64_t seq) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  return torch::randint(c.vocab_size, {batch, seq}, gen, torch::kInt64);
}

// Next-token cross entropy (float32 logits) plus aux_coef times the router's aux loss.
inline torch::Tensor loss_of(const CausalLMOutput& out, const torch::Tensor& ids, double aux_coef) {
  const int64_t vocab = out.logits.size(-1);
  const auto ce = torch::nn::functional::cross_entropy(
      out.logits.reshape({-1, vocab}).to(torch::kFloat), ids.roll(-1, 1).reshape({-1}));
  return ce + aux_coef * out.aux_loss;
}

inline std::vector<std::pair<std::string, at::Tensor>> named_params(torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

inline constexpr int64_t kGlobalBatch = 4, kSeq = 8;

// Relative tolerances (max |diff| / max |ref| per tensor): one set for step 1 (where the params
// are still bit-identical), one for the later steps.
struct Tolerances {
  double main_grad, main_param, loss, grad_norm;
};

struct Diffs {
  double loss = 0, grad_norm = 0, main_grad = 0, main_param = 0;  // max relative differences
};

// max |a - b| / max(max |b|, tiny)
inline double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() / scale;
}

// The two stacks of one rank: the reference (one process, unsharded) and the tested model
// sharded over the mesh, each with its optimizer built from `config` (fp32-main-params §6.1
// order: init dtype, shard, optimizer). ref_mp / mp: the optimizers as MixedPrecisionOptimizer,
// null when they are not one (the caller ASSERTs).
struct Case21Stacks {
  std::shared_ptr<CausalLM> ref_model;
  std::unique_ptr<TrainingOptimizer> ref_opt;
  MixedPrecisionOptimizer* ref_mp = nullptr;
  std::shared_ptr<CausalLM> model;
  std::shared_ptr<FullyShardedModel> fsdp;
  std::unique_ptr<TrainingOptimizer> opt;
  MixedPrecisionOptimizer* mp = nullptr;
};

// Both models from seed 21 in bfloat16; the tested one sharded with `options`, its main grads
// routed to its optimizer and the optimizer given the shard placements.
inline Case21Stacks build_case_2_1(const TrainerConfig& config, const DeviceMesh& mesh,
                                   const FsdpOptions& options) {
  Case21Stacks s;
  s.ref_model = qwen2_moe::make_qwen2_moe(config.model, 21);
  apply_model_init_dtype(*s.ref_model, torch::kBFloat16);
  s.ref_opt = build_optimizer(named_params(*s.ref_model), config);
  s.ref_mp = dynamic_cast<MixedPrecisionOptimizer*>(s.ref_opt.get());
  s.model = qwen2_moe::make_qwen2_moe(config.model, 21);
  apply_model_init_dtype(*s.model, torch::kBFloat16);
  s.fsdp = parallelize(*s.model, mesh, options);
  s.opt = build_optimizer(named_params(*s.model), config);
  s.mp = dynamic_cast<MixedPrecisionOptimizer*>(s.opt.get());
  s.fsdp->set_main_grads(s.opt.get());
  s.opt->chained().set_placements(s.fsdp->placements());
  return s;
}

// `steps` steps of both stacks (ref_mp and mp not null). Per step: the reference accumulates
// the dp micro-batches, the tested model takes this rank's; EXPECTs that .grad stays empty,
// main_grad (gathered) is float32 and within tol.main_grad, the loss (averaged over data
// parallel) and the clipped grad norm (the chained optimizer's, which counts expert slices once
// per ep block) within tol.loss / tol.grad_norm, each model param equals its main param rounded
// to bfloat16 and the main params (gathered) are within tol.main_param; tol is first_step for
// step 1, later_steps after. Writes the max differences to the test dir as "diffs_<rank>"
// ("loss grad_norm main_grad main_param").
inline void compare_case_2_1_steps(const testing::WorkerEnv& worker, const DeviceMesh& mesh,
                                   const TrainerConfig& config, Case21Stacks& s, int steps,
                                   const Tolerances& first_step, const Tolerances& later_steps) {
  const ModelConfig& c = config.model;
  const int64_t dp = mesh.world_size, rows_per_rank = kGlobalBatch / dp;
  Diffs diffs;
  for (int step = 1; step <= steps; ++step) {
    const Tolerances& tol = step == 1 ? first_step : later_steps;
    const auto ids = ids_for_step(c, step, kGlobalBatch, kSeq);
    // Reference step.
    double ref_loss = 0;
    for (int64_t r = 0; r < dp; ++r) {
      const auto micro = ids.narrow(0, r * rows_per_rank, rows_per_rank);
      const auto loss =
          loss_of(s.ref_model->forward(micro), micro, moe_config(c).router_aux_loss_coef);
      (loss / static_cast<double>(dp)).backward();
      s.ref_opt->accumulate_model_grads();
      ref_loss += loss.item<double>() / static_cast<double>(dp);
    }
    std::map<std::string, at::Tensor> ref_main_grads;
    for (auto& [name, p] : named_params(*s.ref_model)) {
      ref_main_grads[name] = s.ref_opt->main_grad(name).clone();
    }
    s.ref_opt->prepare_grads();
    const double ref_norm = clip_grad_norm(s.ref_opt->grads_for_clipping(), 0.5);
    s.ref_opt->step_with_ready_grads();
    s.ref_opt->zero_grad();

    // Tested step: this rank's slice of the same global batch.
    const auto micro = ids.narrow(0, mesh.rank * rows_per_rank, rows_per_rank);
    const auto local_loss =
        loss_of(s.model->forward(micro), micro, moe_config(c).router_aux_loss_coef);
    local_loss.backward();
    const double loss = average_over_data_parallel(local_loss.item<double>(), mesh);
    for (auto& [name, p] : named_params(*s.model)) {
      EXPECT_FALSE(p.grad().defined()) << name << ": .grad must stay empty (fp32-main-params §8.1)";
      const at::Tensor& main_grad = s.opt->main_grad(name);
      EXPECT_EQ(main_grad.scalar_type(), torch::kFloat32) << name;
      const auto full = s.fsdp->gather_full(name, main_grad);
      const double d = rel_diff(full, ref_main_grads.at(name));
      diffs.main_grad = std::max(diffs.main_grad, d);
      EXPECT_LE(d, tol.main_grad) << "step " << step << " main_grad " << name;
    }
    s.opt->prepare_grads();
    const double norm = s.opt->chained().clip_grad_norm(0.5);
    s.opt->step_with_ready_grads();
    s.opt->zero_grad();

    diffs.loss = std::max(diffs.loss, std::abs(loss - ref_loss) / std::abs(ref_loss));
    diffs.grad_norm = std::max(diffs.grad_norm, std::abs(norm - ref_norm) / ref_norm);
    EXPECT_LE(std::abs(loss - ref_loss), tol.loss * std::abs(ref_loss)) << "step " << step;
    EXPECT_LE(std::abs(norm - ref_norm), tol.grad_norm * ref_norm) << "step " << step;

    for (auto& [name, p] : named_params(*s.model)) {
      const at::Tensor& main = s.mp->main_param(name);
      // fp32-main-params §2.1: after each step the model param is its main param rounded to
      // bfloat16.
      EXPECT_TRUE(torch::equal(p.detach(), main.to(torch::kBFloat16))) << name;
      const auto full_main = s.fsdp->gather_full(name, main);
      const double d = rel_diff(full_main, s.ref_mp->main_param(name));
      diffs.main_param = std::max(diffs.main_param, d);
      EXPECT_LE(d, tol.main_param) << "step " << step << " main param " << name;
    }
  }
  std::ostringstream text;
  text << diffs.loss << " " << diffs.grad_norm << " " << diffs.main_grad << " " << diffs.main_param;
  worker.write_text("diffs_" + std::to_string(mesh.rank), text.str());
}

// Runs `worker` (a body that calls compare_case_2_1_steps) on nproc ranks, ASSERTs they all
// succeeded, and records and prints each rank's "diffs_<rank>".
inline void run_and_report(const std::string& worker, int nproc, const ParallelConfig& parallel,
                           std::map<std::string, std::string> env = {}) {
  const auto result = testing::run_workers(worker, nproc, parallel, std::move(env), 120);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  for (int r = 0; r < nproc; ++r) {
    const std::string diffs = result.read_text("diffs_" + std::to_string(r));
    ::testing::Test::RecordProperty("diffs_rank" + std::to_string(r), diffs);
    std::cout << worker << " rank " << r << " diffs (loss norm main_grad main_param): " << diffs
              << "\n";
  }
}

}  // namespace mixtrain::test_support
