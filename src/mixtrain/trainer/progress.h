// One-line training progress on stderr (or any FILE*).
//
// Terminal mode redraws one line in place on every update:
//   "\r step 12/100 [####----------------] loss 4.1234 | 12.3k tok/s | ETA 0:41"
// padded with spaces over the previous draw, with no newline until finish(). Plain mode (a
// pipe or a log file) prints "step 12/100 | loss 4.1234 | 12.3k tok/s | elapsed 0:05 | ETA 0:41"
// as a whole line every log_every steps and on the last step; log_every <= 0 prints only the
// last step. Steps count from 1; step == total_steps is the last. elapsed_s is seconds since
// this process's loop started: the ETA uses the rate since the first update, so a run resumed
// at step 1000 does not think it did 1000 steps in its first seconds. total_steps <= 0 means
// unknown: no bar, no ETA. Every draw is flushed. The destructor calls finish(), so the FILE*
// must outlive the bar. Not thread-safe: the training loop's thread owns it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "mixtrain/trainer/run_hook.h"

namespace mixtrain {

// As a run hook (run_hook.h): each step's row updates it; the end of the run finishes it.
class ProgressBar final : public RunHook {
 public:
  ProgressBar(int64_t total_steps, int64_t log_every, bool is_terminal, std::FILE* out = stderr);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void update(int64_t step, double loss, double tokens_per_s, double elapsed_s);
  void on_step(const StepMetrics& row) override {
    update(row.step, row.loss, row.tokens_per_s, row.elapsed_s);
  }
  void on_end() override { finish(); }

  // Ends an open terminal line with '\n' (so later output starts on a fresh line); idempotent,
  // a no-op in plain mode.
  void finish();

 private:
  double eta_seconds(int64_t step, double elapsed_s) const;

  int64_t total_steps_;
  int64_t log_every_;
  bool is_terminal_;
  std::FILE* out_;
  bool started_ = false;    // the first update has fixed the ETA baseline
  int64_t base_step_ = 0;   // the step before the first update, which began at elapsed 0
  bool line_open_ = false;  // terminal mode: a drawn line not yet ended by '\n'
  size_t last_width_ = 0;   // characters of the last terminal draw, for overwriting leftovers
};

// "0:41", "10:00", "1:02:03" (seconds rounded to the nearest); "--:--" for negative/NaN/Inf.
std::string format_eta(double seconds);

// "950 tok/s", "12.3k tok/s", "1.2M tok/s"; "-- tok/s" for negative/NaN/Inf.
std::string format_rate(double tokens_per_s);

}  // namespace mixtrain
