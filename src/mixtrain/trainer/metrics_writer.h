// Per-step training metrics as JSON Lines: <run_dir>/metrics.jsonl.
//
// One JSON object per step, keys in this order: step, loss, grad_norm, lr, tokens_per_s,
// elapsed_s, aux_loss, loss_scale, skipped_steps; with QK-clip (optimizer.muon_config.
// muon_qk_clip_tau > 0) also qk_clip_heads, qk_max_logit; with a profile (train.profile) also
// forward_s, backward_s, reduce_s, clip_s, optimizer_s, checkpoint_s, step_s (step_profile.h);
// with train.count_ops also ops_<phase> and allocations_<phase> for forward, backward, clip,
// optimizer, checkpoint, other, step, then collectives (step_profile.h StepOps);
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
#include "mixtrain/trainer/run_hook.h"
#include "mixtrain/trainer/step_metrics.h"

namespace mixtrain {

// As a run hook (run_hook.h): each step's row and each evaluation's row, as they come.
class MetricsWriter final : public RunHook {
 public:
  explicit MetricsWriter(const std::string& run_dir, int64_t resumed_step = 0);

  void on_step(const StepMetrics& row) override { write(row); }
  void on_eval(const EvalMetrics& row, const EvalResult&) override { write_eval(row); }

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
