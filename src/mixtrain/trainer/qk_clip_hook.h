// QK-clip as a step hook (optimizer.muon_config.muon_qk_clip_tau > 0; optim/qk_clip.h): every
// training forward records its heads' max logits (one more Q K^T per attention), and after each
// optimizer step the heads above tau get their query/key projections rescaled, on what the
// optimizer updated; the step's result gets the figures. Evaluation forwards record nothing.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "mixtrain/core/param_placement.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/model/max_logit_recorder.h"
#include "mixtrain/optim/training_optimizer.h"
#include "mixtrain/trainer/step_hook.h"

namespace mixtrain {

class QkClipHook final : public StepHook {
 public:
  // Installs the recorder on `model`; `placements` gives how each parameter is held now
  // (empty: whole). The model, optimizer and mesh outlive the hook.
  QkClipHook(CausalLM& model, TrainingOptimizer& optimizer, const DeviceMesh& mesh,
             const ModelConfig& model_config, double tau,
             std::function<std::vector<ParamPlacement>()> placements);

  void before_forward(int64_t step) override;
  void after_update(StepResult& result) override;
  void before_eval() override;
  void after_eval() override;

 private:
  CausalLM& model_;
  TrainingOptimizer& optimizer_;
  const DeviceMesh& mesh_;
  ModelConfig model_config_;  // heads and head_dim (the whole model's, under tensor parallelism)
  double tau_;
  std::function<std::vector<ParamPlacement>()> placements_;
  std::shared_ptr<MaxLogitRecorder> max_logits_ = std::make_shared<MaxLogitRecorder>();
};

}  // namespace mixtrain
