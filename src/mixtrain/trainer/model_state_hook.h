// The model's own state as a step hook (CausalLM::model_state; deepseek_v3's expert-selection
// biases, docs/config.md "DeepSeek-V3"): training forwards collect the statistics the model
// needs (the experts' loads), evaluation forwards do not; after each optimizer step the model
// updates its state from them, summed over the ranks that saw other tokens (the dp_shard group,
// which holds the cp ranks, then the dp_replicate group; tensor-parallel ranks see the same
// tokens and count the same), so every rank gets the same state. Installed only for a model
// with state.
#pragma once

#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/trainer/step_hook.h"

namespace mixtrain {

class ModelStateHook final : public StepHook {
 public:
  // The model and mesh outlive the hook.
  ModelStateHook(CausalLM& model, const DeviceMesh& mesh);

  void before_forward(int64_t step) override;
  void after_update(StepResult& result) override;
  void before_eval() override;
  void after_eval() override;

 private:
  CausalLM& model_;
  const DeviceMesh& mesh_;
};

}  // namespace mixtrain
