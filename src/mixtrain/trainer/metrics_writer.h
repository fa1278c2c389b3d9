// Per-step training metrics as JSON Lines: <run_dir>/metrics.jsonl.
//
// One JSON object per step, keys in this order: step, loss, grad_norm, lr, tokens_per_s,
// elapsed_s, aux_loss, loss_scale, skipped_steps; with QK-clip (optimizer.muon_config.
// muon_qk_clip_tau > 0) also qk_clip_heads, qk_max_logit; with a profile (train.profile) also
// forward_s, backward_s, reduce_s, clip_s, optimizer_s, checkpoint_s, step_s (step_profile.h);
// on a log step with optimizer.muon_telemetry, per Muon group g: muon_g<g>_ortho_error_mean,
// muon_g<g>_ortho_error_max, muon_g<g>_ortho_sampled, muon_g<g>_update_rms
// (optim/muon_telemetry.h).
// An evaluation (train.eval_every) adds its own row after its step's row: step, eval_loss,
// eval_ppl, eval_tokens (trainer/evaluator.h); readers tell the two kinds apart by the keys.
// A non-finite value (a NaN loss, an infinite grad norm) is written as null so every line
// stays valid JSON. Each line is flushed to the kernel before write() returns, so a Ctrl-C or a
// crash of the process loses nothing already written (a power loss may; we do not fsync per
// step). Opening creates run_dir and its parents and truncates
// an existing metrics.jsonl: a new run starts a new file. A run resumed from a checkpoint of step
// S (resumed_step = S > 0) keeps the existing file's lines of steps <= S instead, so the file
// reads as one run again. Any failure to create, open or write
// throws UserError naming the path. Only rank 0 is meant to construct one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/posix_file.h"
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
  std::vector<MuonGroupTelemetry> muon = {};            // muon_telemetry on a log step
  std::optional<QkClipMetrics> qk_clip = std::nullopt;  // QK-clip on
};

struct EvalMetrics {
  int64_t step = 0;  // the training step after which the model was evaluated
  double eval_loss = 0.0;
  double eval_ppl = 0.0;
  int64_t eval_tokens = 0;
};

class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& run_dir, int64_t resumed_step = 0);

  // Appends one line and flushes it; throws UserError if the line cannot be written.
  void write(const StepMetrics& metrics);
  void write_eval(const EvalMetrics& metrics);

  // <run_dir>/metrics.jsonl
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& text);  // whole, or UserError naming the file

  std::string path_;
  FileDescriptor file_;
};

// One metrics line (no trailing newline); exposed so tests and tools share the exact format.
std::string metrics_json_line(const StepMetrics& metrics);
std::string metrics_json_line(const EvalMetrics& metrics);

}  // namespace mixtrain
