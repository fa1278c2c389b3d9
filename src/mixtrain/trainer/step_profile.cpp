#include "mixtrain/trainer/step_profile.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "mixtrain/trainer/progress.h"

namespace mixtrain {
namespace {

std::string phase(const char* name, double seconds, double step_s) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%s %.3f (%.0f%%)", name, seconds,
                step_s > 0 ? 100.0 * seconds / step_s : 0.0);
  return buf;
}

}  // namespace

double StepTimes::other_s() const {
  return std::max(0.0, step_s - forward_s - backward_s - clip_s - optimizer_s - checkpoint_s);
}

StepTimes& StepTimes::operator+=(const StepTimes& other) {
  forward_s += other.forward_s;
  backward_s += other.backward_s;
  reduce_s += other.reduce_s;
  clip_s += other.clip_s;
  optimizer_s += other.optimizer_s;
  checkpoint_s += other.checkpoint_s;
  step_s += other.step_s;
  return *this;
}

void StepProfile::add(int64_t step, const StepTimes& times, double tokens) {
  if (steps_ == 0) first_step_ = step;
  last_step_ = step;
  ++steps_;
  sum_ += times;
  tokens_ += tokens;
}

std::string StepProfile::format() const {
  if (steps_ == 0) return "";
  const double n = static_cast<double>(steps_);
  StepTimes avg;
  avg.forward_s = sum_.forward_s / n;
  avg.backward_s = sum_.backward_s / n;
  avg.reduce_s = sum_.reduce_s / n;
  avg.clip_s = sum_.clip_s / n;
  avg.optimizer_s = sum_.optimizer_s / n;
  avg.checkpoint_s = sum_.checkpoint_s / n;
  avg.step_s = sum_.step_s / n;
  char head[96];
  if (first_step_ == last_step_) {
    std::snprintf(head, sizeof(head), "profile step %" PRId64 ": %.3f s/step = ", last_step_,
                  avg.step_s);
  } else {
    std::snprintf(head, sizeof(head),
                  "profile steps %" PRId64 "-%" PRId64 ": %.3f s/step = ", first_step_, last_step_,
                  avg.step_s);
  }
  char reduce[48];
  std::snprintf(reduce, sizeof(reduce), "; gradient reduce %.3f)", avg.reduce_s);
  std::string backward = phase("backward", avg.backward_s, avg.step_s);
  backward.pop_back();  // its ")": "backward 0.250 (49%; gradient reduce 0.030)"
  backward += reduce;
  return std::string(head) + phase("forward", avg.forward_s, avg.step_s) + " | " + backward +
         " | " + phase("clip", avg.clip_s, avg.step_s) + " | " +
         phase("optimizer", avg.optimizer_s, avg.step_s) + " | " +
         phase("checkpoint", avg.checkpoint_s, avg.step_s) + " | " +
         phase("other", avg.other_s(), avg.step_s) + " | " +
         format_rate(sum_.step_s > 0 ? tokens_ / sum_.step_s : 0.0);
}

void StepProfile::clear() {
  *this = StepProfile{};
}

}  // namespace mixtrain
