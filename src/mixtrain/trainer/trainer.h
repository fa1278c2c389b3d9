// The single-process training loop (issue 2): build order of the RFC's section 6.1 (model,
// then model_init_dtype, then optimizer), then per step: micro-batches with gradient
// accumulation, cross-entropy + router aux loss, global grad-norm clipping, scheduled LR,
// optimizer step, metrics.
//
// Outputs under run_dir: metrics.jsonl (one JSON object per step, flushed per line) and
// loss.svg (written at the end, also after Ctrl-C).
#pragma once

#include <cstdint>
#include <string>

#include "mixtrain/config/load.h"

namespace mixtrain {

struct TrainOptions {
  std::string run_dir;
  bool is_terminal = false;  // progress bar redrawn in place vs. plain log lines
};

struct TrainSummary {
  int64_t steps_completed = 0;
  bool interrupted = false;
  double first_loss = 0.0;
  double last_loss = 0.0;
  std::string metrics_path;
  std::string plot_path;
};

// Throws ConfigError for a configuration this build cannot train, before building anything.
TrainSummary run_training(const ResolvedConfig& resolved, const TrainOptions& options);

}  // namespace mixtrain
