// Learning-rate schedule: linear warmup, then constant, linear or cosine decay.
//
// factor(step) multiplies the base lr of every group; step is 1-based (the step about to
// run), W = warmup_steps, T = total_steps, m = min_lr_ratio:
//   step <= W (W > 0):  step / W                     (reaches 1 at step W)
//   after warmup:       p = clamp((step - W) / (T - W), 0, 1)   (p = 1 when T <= W)
//     constant: 1      linear: 1 - (1 - m) p      cosine: m + (1 - m) (1 + cos(pi p)) / 2
// so the last step (step = T) runs at m x base for linear and cosine.
#pragma once

#include <cstdint>

#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

class LrSchedule {
 public:
  // Throws std::invalid_argument for warmup_steps < 0, min_lr_ratio outside [0, 1], an unknown
  // decay or total_steps < 1 (validate_config refuses each first, naming the user's key).
  LrSchedule(const LrSchedulerConfig& config, int64_t total_steps);

  // Throws std::invalid_argument for step < 1.
  double factor(int64_t step) const;

 private:
  enum class Decay { kConstant, kLinear, kCosine };
  int64_t warmup_steps_;
  int64_t total_steps_;
  double min_lr_ratio_;
  Decay decay_;
};

}  // namespace mixtrain
