// One training step's row and one evaluation's row as run_training reports them (run_hook.h):
// what metrics.jsonl holds (metrics_writer.h), the progress line and the log read.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "mixtrain/optim/muon_telemetry.h"
#include "mixtrain/trainer/step_profile.h"

namespace mixtrain {

// QK-clip's numbers of one step (optimizer.muon_config.muon_qk_clip_tau > 0).
struct QkClipMetrics {
  int64_t heads_clipped = 0;  // query heads (over all layers) rescaled after the step
  double max_logit = 0.0;     // max attention logit over every head, micro-batch and rank
};

struct StepMetrics {
  int64_t step = 0;
  double loss = 0.0;
  double grad_norm = 0.0;
  double lr = 0.0;
  double tokens_per_s = 0.0;
  double elapsed_s = 0.0;     // seconds since the training loop started
  double aux_loss = 0.0;      // router load-balancing loss (already scaled by its coefficient)
  double loss_scale = 1.0;    // float16 dynamic loss scale after this step (1 otherwise)
  int64_t skipped_steps = 0;  // steps skipped so far for inf/nan gradients (float16)
  std::optional<StepTimes> profile = std::nullopt;      // train.profile: this step's split
  std::optional<StepOps> ops = std::nullopt;            // train.count_ops: its op counts
  std::vector<MuonGroupTelemetry> muon = {};            // muon_telemetry on a log step
  std::optional<QkClipMetrics> qk_clip = std::nullopt;  // QK-clip on
};

struct EvalMetrics {
  int64_t step = 0;  // the training step after which the model was evaluated
  double eval_loss = 0.0;
  double eval_ppl = 0.0;
  int64_t eval_tokens = 0;
};

}  // namespace mixtrain
