#include "mixtrain/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace mixtrain {
namespace {
constexpr double kPi = 3.14159265358979323846;
}  // namespace

LrSchedule::LrSchedule(const LrSchedulerConfig& config, int64_t total_steps)
    : warmup_steps_(config.warmup_steps),
      total_steps_(total_steps),
      min_lr_ratio_(config.min_lr_ratio),
      decay_(Decay::kConstant) {
  // validate_config refuses these in the user's keys; here they are the class's invariants.
  if (config.warmup_steps < 0) {
    throw std::invalid_argument("LrSchedule: warmup_steps must be >= 0, got " +
                                std::to_string(config.warmup_steps));
  }
  if (!(config.min_lr_ratio >= 0.0 && config.min_lr_ratio <= 1.0)) {
    throw std::invalid_argument("LrSchedule: min_lr_ratio must be in [0, 1], got " +
                                std::to_string(config.min_lr_ratio));
  }
  if (config.decay == "constant") {
    decay_ = Decay::kConstant;
  } else if (config.decay == "linear") {
    decay_ = Decay::kLinear;
  } else if (config.decay == "cosine") {
    decay_ = Decay::kCosine;
  } else {
    throw std::invalid_argument("LrSchedule: decay '" + config.decay +
                                "' is not one of constant, linear, cosine");
  }
  if (total_steps < 1) {
    throw std::invalid_argument("LrSchedule: total_steps must be >= 1, got " +
                                std::to_string(total_steps));
  }
}

double LrSchedule::factor(int64_t step) const {
  if (step < 1)
    throw std::invalid_argument("LrSchedule::factor: step is 1-based, got " + std::to_string(step));
  if (warmup_steps_ > 0 && step <= warmup_steps_) {
    return static_cast<double>(step) / static_cast<double>(warmup_steps_);
  }
  if (decay_ == Decay::kConstant) return 1.0;
  const int64_t decay_steps = total_steps_ - warmup_steps_;
  // Past the end (or no decay steps at all) the schedule stays at its final value.
  const double p =
      decay_steps <= 0
          ? 1.0
          : std::clamp(static_cast<double>(step - warmup_steps_) / static_cast<double>(decay_steps),
                       0.0, 1.0);
  const double m = min_lr_ratio_;
  if (decay_ == Decay::kLinear) return 1.0 - (1.0 - m) * p;
  return m + (1.0 - m) * (1.0 + std::cos(kPi * p)) / 2.0;
}

}  // namespace mixtrain
