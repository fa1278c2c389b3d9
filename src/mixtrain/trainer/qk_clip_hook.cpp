#include "mixtrain/trainer/qk_clip_hook.h"

#include <utility>

#include "mixtrain/optim/qk_clip.h"
#include "mixtrain/trainer/trainer.h"

namespace mixtrain {

QkClipHook::QkClipHook(CausalLM& model, TrainingOptimizer& optimizer, const DeviceMesh& mesh,
                       const ModelConfig& model_config, double tau,
                       std::function<std::vector<ParamPlacement>()> placements)
    : model_(model),
      optimizer_(optimizer),
      mesh_(mesh),
      model_config_(model_config),
      tau_(tau),
      placements_(std::move(placements)) {
  model_.set_max_logit_recorder(max_logits_);
}

void QkClipHook::before_forward(int64_t) {
  max_logits_->clear();  // this step's micro-batches only (not evaluations)
}

void QkClipHook::after_update(StepResult& result) {
  const QkClipStats stats =
      apply_qk_clip(optimizer_.chained(), reduce_max_logits(*mesh_.world, max_logits_->layers()),
                    placements_(), model_config_, tau_, model_.param_roles());
  result.qk_clip = true;
  result.qk_clip_heads = stats.heads_clipped;
  result.qk_max_logit = stats.max_logit;
}

// QK-clip's statistic is the training batches'; evaluation forwards skip its extra work.
void QkClipHook::before_eval() {
  model_.set_max_logit_recorder(nullptr);
}

void QkClipHook::after_eval() {
  model_.set_max_logit_recorder(max_logits_);
}

}  // namespace mixtrain
