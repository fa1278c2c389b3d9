// Drives a Trainer one step at a time for the checkpoint scenarios and records what the cases of
// fp32-main-params §2 compare: the step's loss and global grad norm, the float32 gradient every
// optimizer param is updated with (after clipping), the main params and the model params after the
// update, all gathered to whole tensors (FSDP shards joined over dp_shard).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "mixtrain/config/load.h"
#include "mixtrain/core/safetensors.h"
#include "mixtrain/distributed/fsdp.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/training_optimizer.h"
#include "mixtrain/trainer/trainer.h"

namespace mixtrain::test_support {

// configs/qwen2_moe_tiny.yaml (bfloat16, fp32_main_params, Muon + AdamW) shrunk to the tiny
// model of tiny_model_config.h, a global batch of 4 sequences of 8 tokens (micro batch 1, so
// 1, 2 and 4 ranks all see the same batch) and a constant LR (no schedule dependence on
// train.steps), plus `overrides`.
inline ResolvedConfig checkpoint_test_config(std::vector<std::string> overrides) {
  std::vector<std::string> all = {"model.vocab_size=37",
                                  "model.hidden_size=24",
                                  "model.num_layers=2",
                                  "model.num_heads=4",
                                  "model.num_kv_heads=2",
                                  "model.head_dim=8",
                                  "model.moe_intermediate_size=12",
                                  "model.num_experts=4",
                                  "model.num_experts_per_tok=2",
                                  "model.shared_expert_intermediate_size=20",
                                  "model.max_seq_len=16",
                                  "data.seq_len=8",
                                  "data.micro_batch_size=1",
                                  "data.global_batch_size=4",
                                  "train.steps=4",
                                  "train.lr_scheduler.warmup_steps=0",
                                  "train.lr_scheduler.decay=constant"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return load_config(MIXTRAIN_SOURCE_DIR "/configs/qwen2_moe_tiny.yaml", all);
}

// Whole (global) tensor of a parameter-shaped local tensor (a collective when sharded: over
// the shard group and, for a tensor-parallel slice, the tp group).
inline at::Tensor whole(Trainer& trainer, const std::string& name, const at::Tensor& local) {
  FullyShardedModel* sharded = trainer.sharded();
  return sharded ? sharded->gather_global(name, local.contiguous()) : local.detach().clone();
}

// whole() of each (names[i], locals[i]), in one collective per process group and dtype.
inline std::vector<at::Tensor> whole(Trainer& trainer, const std::vector<std::string>& names,
                                     const std::vector<at::Tensor>& locals) {
  if (FullyShardedModel* sharded = trainer.sharded()) return sharded->gather_global(names, locals);
  std::vector<at::Tensor> out;
  for (const at::Tensor& local : locals) out.push_back(local.detach().clone());
  return out;
}

// One step, recorded: "loss", "grad_norm" (0-dim float64), with `with_aux_loss` also
// "aux_loss" (0-dim float64, the router's load-balancing loss before its coefficient),
// "grad.<fqn>", "main.<fqn>", "model.<fqn>".
inline NamedTensors recorded_step(Trainer& trainer, bool with_aux_loss = false) {
  NamedTensors out;
  const StepResult result = trainer.compute_gradients();
  out.emplace_back("loss", at::scalar_tensor(result.loss, at::kDouble));
  out.emplace_back("grad_norm", at::scalar_tensor(result.grad_norm, at::kDouble));
  if (with_aux_loss) out.emplace_back("aux_loss", at::scalar_tensor(result.aux_loss, at::kDouble));
  ChainedOptimizer& chained = trainer.optimizer().chained();
  const std::vector<std::string>& names = chained.names();
  std::vector<at::Tensor> grads;
  for (const auto& name : names) grads.push_back(chained.optimizer_param(name).grad());
  const std::vector<at::Tensor> whole_grads = whole(trainer, names, grads);
  for (size_t i = 0; i < names.size(); ++i) out.emplace_back("grad." + names[i], whole_grads[i]);
  trainer.apply_update();
  std::vector<std::string> twice;  // main and model param of each name
  std::vector<at::Tensor> params;
  for (const auto& name : names) {
    twice.insert(twice.end(), {name, name});
    params.insert(params.end(), {chained.optimizer_param(name), chained.model_param(name)});
  }
  const std::vector<at::Tensor> whole_params = whole(trainer, twice, params);
  for (size_t i = 0; i < names.size(); ++i) {
    out.emplace_back("main." + names[i], whole_params[2 * i]);
    out.emplace_back("model." + names[i], whole_params[2 * i + 1]);
  }
  return out;
}

// The optimizer state (main params included) as whole tensors, copied; 0-dim state (step
// counters) as it is on this rank.
inline NamedTensors whole_optimizer_state(Trainer& trainer) {
  NamedTensors out;
  for (const auto& [key, local] : trainer.optimizer().state_dict()) {
    if (local.dim() == 0) {
      out.emplace_back(key, local.clone());
      continue;
    }
    const bool is_main = key.rfind(kMainParamPrefix, 0) == 0;
    std::string fqn =
        key.substr(std::string(is_main ? kMainParamPrefix : kOptimizerStatePrefix).size());
    if (!is_main) fqn = fqn.substr(0, fqn.rfind('.'));
    out.emplace_back(key, whole(trainer, fqn, local));
  }
  return out;
}

// The model params as whole tensors under their checkpoint keys (model.<fqn>), copied.
inline NamedTensors whole_model_params(Trainer& trainer) {
  NamedTensors out;
  ChainedOptimizer& chained = trainer.optimizer().chained();
  for (const auto& name : chained.names()) {
    out.emplace_back("model." + name, whole(trainer, name, chained.model_param(name)));
  }
  return out;
}

inline std::map<std::string, at::Tensor> as_map(const NamedTensors& tensors) {
  return std::map<std::string, at::Tensor>(tensors.begin(), tensors.end());
}

// max |a - b| / max(max |b|, tiny), in float64.
inline double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

// Bitwise equality of every recorded tensor (same computation on the same state).
inline void expect_bitwise_equal(const NamedTensors& actual, const NamedTensors& expected) {
  const auto a = as_map(actual);
  ASSERT_EQ(a.size(), expected.size());
  for (const auto& [key, want] : expected) {
    ASSERT_TRUE(a.count(key)) << key;
    EXPECT_TRUE(a.at(key).equal(want))
        << key << ": max |diff| " << relative_difference(a.at(key), want) << " (relative)";
  }
}

}  // namespace mixtrain::test_support
