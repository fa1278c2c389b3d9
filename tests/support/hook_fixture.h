// A model and its optimizer stack as the Trainer builds them on one process, in float32, for the
// step hooks' tests (trainer/step_hook.h): the tiny Qwen2-MoE of checkpoint_test_config with
// Muon + AdamW and `overrides`, no fp32 main params, the model's own roles. Built in place (the
// hooks keep references to the mesh and the optimizer), never moved.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/training_optimizer.h"
#include "support/trainer_probe.h"

namespace mixtrain::test_support {

struct HookFixture {
  // config_file: another model's config (configs/deepseek_v3_tiny.yaml) with the same float32
  // overrides, instead of checkpoint_test_config.
  explicit HookFixture(std::vector<std::string> overrides, const std::string& config_file = "") {
    overrides.insert(overrides.begin(),
                     {"model_init_dtype=float32", "optimizer.fp32_main_params=false",
                      "fsdp_config.mix_precision.param_dtype=float32",
                      "fsdp_config.mix_precision.output_dtype=float32"});
    resolved = config_file.empty() ? checkpoint_test_config(overrides)
                                   : load_config(config_file, overrides);
    model = build_model(resolved.config.model, 11);
    model->to(at::kFloat);
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto& item : model->named_parameters()) named.emplace_back(item.key(), item.value());
    optimizer = build_optimizer(named, resolved.config, model->param_roles());
  }
  HookFixture(const HookFixture&) = delete;
  HookFixture& operator=(const HookFixture&) = delete;

  // A [2, 8] batch of token ids drawn from `seed`.
  at::Tensor batch(uint64_t seed) const {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    return at::randint(0, resolved.config.model.vocab_size, {2, 8}, gen, at::kLong);
  }

  ResolvedConfig resolved;
  std::shared_ptr<CausalLM> model;
  std::unique_ptr<TrainingOptimizer> optimizer;
  DeviceMesh mesh = make_single_process_mesh();
};

}  // namespace mixtrain::test_support
