// The log lines of the optional features, as run hooks (run_hook.h), rank 0:
//   StepLog     optimizer.muon_telemetry: "step N: muon g0: ..." on each row that has figures
//               (log steps); QK-clip: "step N QK-clip: max attention logit X, K head(s)
//               clipped" on log steps; train.count_ops: "op counts step N: ..." on log steps
//               (StepOps::format); train.eval_every: "eval at step N: ..." per evaluation.
//   ProfileLog  train.profile: each row's phase times summed (step_profile.h StepProfile), and
//               on every log step their average logged and the sum restarted.
// Log steps: every train.log_every-th and the last (is_log_step).
#pragma once

#include <cstdint>

#include "mixtrain/trainer/run_hook.h"
#include "mixtrain/trainer/step_profile.h"

namespace mixtrain {

class StepLog final : public RunHook {
 public:
  StepLog(int64_t log_every, int64_t steps) : log_every_(log_every), steps_(steps) {}
  void on_step(const StepMetrics& row) override;
  void on_eval(const EvalMetrics& row, const EvalResult& result) override;

 private:
  int64_t log_every_, steps_;
};

class ProfileLog final : public RunHook {
 public:
  // tokens_per_step: the global batch's tokens (the line's tokens/s).
  ProfileLog(int64_t log_every, int64_t steps, double tokens_per_step)
      : log_every_(log_every), steps_(steps), tokens_per_step_(tokens_per_step) {}
  void on_step(const StepMetrics& row) override;

 private:
  int64_t log_every_, steps_;
  double tokens_per_step_;
  StepProfile profile_;  // the steps since the last line
};

}  // namespace mixtrain
