#include "mixtrain/trainer/step_profile.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <utility>

#include "mixtrain/trainer/progress.h"

namespace mixtrain {
namespace {

double percent(double seconds, double step_s) {
  return step_s > 0 ? 100.0 * seconds / step_s : 0.0;
}

std::string phase(const char* name, double seconds, double step_s) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%s %.3f (%.0f%%)", name, seconds, percent(seconds, step_s));
  return buf;
}

}  // namespace

double StepTimes::other_s() const {
  return std::max(0.0, step_s - forward_s - backward_s - clip_s - optimizer_s - checkpoint_s);
}

StepTimes& StepTimes::operator*=(double factor) {
  forward_s *= factor;
  backward_s *= factor;
  reduce_s *= factor;
  clip_s *= factor;
  optimizer_s *= factor;
  checkpoint_s *= factor;
  step_s *= factor;
  return *this;
}

StepTimes& StepTimes::operator+=(const StepTimes& other) {
  forward_s += other.forward_s;
  backward_s += other.backward_s;
  reduce_s += other.reduce_s;
  clip_s += other.clip_s;
  optimizer_s += other.optimizer_s;
  checkpoint_s += other.checkpoint_s;
  step_s += other.step_s;
  peak_device_bytes = std::max(peak_device_bytes, other.peak_device_bytes);
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
  StepTimes avg = sum_;
  avg *= 1.0 / static_cast<double>(steps_);
  char head[96];
  if (first_step_ == last_step_) {
    std::snprintf(head, sizeof(head), "profile step %" PRId64 ": %.3f s/step = ", last_step_,
                  avg.step_s);
  } else {
    std::snprintf(head, sizeof(head),
                  "profile steps %" PRId64 "-%" PRId64 ": %.3f s/step = ", first_step_, last_step_,
                  avg.step_s);
  }
  char device_memory[64] = "";
  if (sum_.peak_device_bytes > 0) {
    std::snprintf(device_memory, sizeof(device_memory), " | peak device memory %.2f GiB",
                  static_cast<double>(sum_.peak_device_bytes) / (1 << 30));
  }
  char backward[96];
  std::snprintf(backward, sizeof(backward), "backward %.3f (%.0f%%; gradient reduce %.3f)",
                avg.backward_s, percent(avg.backward_s, avg.step_s), avg.reduce_s);
  return std::string(head) + phase("forward", avg.forward_s, avg.step_s) + " | " + backward +
         " | " + phase("clip", avg.clip_s, avg.step_s) + " | " +
         phase("optimizer", avg.optimizer_s, avg.step_s) + " | " +
         phase("checkpoint", avg.checkpoint_s, avg.step_s) + " | " +
         phase("other", avg.other_s(), avg.step_s) + " | " +
         format_rate(sum_.step_s > 0 ? tokens_ / sum_.step_s : 0.0) + device_memory;
}

OpCounts StepOps::other() const {
  OpCounts rest = step;
  for (const OpCounts* phase : {&forward, &backward, &clip, &optimizer, &checkpoint}) {
    rest = rest - *phase;
  }
  return rest;
}

std::vector<std::pair<const char*, OpCounts>> StepOps::phases() const {
  return {{"forward", forward},     {"backward", backward},     {"clip", clip},
          {"optimizer", optimizer}, {"checkpoint", checkpoint}, {"other", other()}};
}

// "op counts step 3: 5210 ops = forward 1200 | backward 2100 | ...; 812 allocations = forward
// 300 | ...; 0 collectives"
std::string StepOps::format(int64_t step_number) const {
  const auto by_phase = phases();
  auto split = [&](int64_t total, const char* what, int64_t OpCounts::*field) {
    std::string out = std::to_string(total) + " " + what + " =";
    const char* separator = " ";
    for (const auto& [name, counts] : by_phase) {
      out += separator + std::string(name) + " " + std::to_string(counts.*field);
      separator = " | ";
    }
    return out;
  };
  return "op counts step " + std::to_string(step_number) + ": " +
         split(step.ops, "ops", &OpCounts::ops) + "; " +
         split(step.allocations, "allocations", &OpCounts::allocations) + "; " +
         std::to_string(collectives) + " collectives";
}

void StepProfile::clear() {
  *this = StepProfile{};
}

}  // namespace mixtrain
