// What run_training reports, as hooks on its rows (docs/architecture.md §3). The loop reads
// its steps' results in batches (at log, save and eval steps and at the end: trainer.h), then
// calls on_step(row) for each of them in step order; after an evaluation, on_eval(row, result);
// at the end of a run that did not fail (an interrupted one included), on_end(). Only rank 0
// reports: the hooks write files and the log. They are called in the order installed:
// metrics.jsonl (metrics_writer.h), the progress line (progress.h), the log lines of the
// optional features (step_log.h, step_profile.h's ProfileLog), the loss picture (loss_plot.h).
#pragma once

#include <cstdint>

#include "mixtrain/trainer/step_metrics.h"

namespace mixtrain {

struct EvalResult;  // evaluator.h

class RunHook {
 public:
  virtual ~RunHook() = default;
  virtual void on_step(const StepMetrics& /*row*/) {}
  virtual void on_eval(const EvalMetrics& /*row*/, const EvalResult& /*result*/) {}
  virtual void on_end() {}
};

// The steps the trainer logs: every log_every-th and the last, as the progress line prints
// them. log_every <= 0 (validate refuses it; a hand-built config could pass it): the last only,
// rather than a division by zero.
inline bool is_log_step(int64_t step, int64_t log_every, int64_t steps) {
  return step == steps || (log_every > 0 && step % log_every == 0);
}

}  // namespace mixtrain
