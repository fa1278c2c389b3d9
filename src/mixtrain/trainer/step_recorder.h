// The phase times of one training step (step_profile.h says what each phase holds). The
// trainer starts a record per step, times each phase with a PhaseTimer at the top of its scope
// and reads the record when the step is done:
//
//   recorder.start();
//   { PhaseTimer t(recorder, Phase::kForward); ... }   // added to forward_s at the scope's end
//
// A phase entered several times in a step (forward and backward once per micro-batch) adds up.
// A PhaseTimer also adds the phase's op counts (core/op_counter.h; zero unless an OpCountScope
// is active).
// With a synchronize function set (train.profile on a device), each phase ends by waiting for
// the device, so its time holds the kernels it queued.
#pragma once

#include <functional>
#include <utility>

#include "mixtrain/core/op_counter.h"
#include "mixtrain/core/scoped_timer.h"
#include "mixtrain/trainer/step_profile.h"

namespace mixtrain {

enum class Phase { kForward, kBackward, kReduce, kClip, kOptimizer, kCheckpoint };

class StepRecorder {
 public:
  // A new step: every phase at zero.
  void start() {
    times_ = StepTimes{};
    ops_ = StepOps{};
  }
  // The seconds of `phase` so far in this step (what a PhaseTimer adds to).
  double& seconds(Phase phase);
  void add(Phase phase, double seconds) { this->seconds(phase) += seconds; }
  // The step so far; its step_s is left to whoever times the whole step.
  const StepTimes& times() const { return times_; }
  StepTimes& times() { return times_; }
  // The op counts of `phase` so far in this step; kReduce has none of its own (it is in
  // backward): std::invalid_argument.
  OpCounts& counts(Phase phase);
  const StepOps& ops() const { return ops_; }
  StepOps& ops() { return ops_; }
  // Called at the end of every phase; empty: nothing to wait for (the CPU).
  void set_synchronize(std::function<void()> synchronize) { synchronize_ = std::move(synchronize); }
  void synchronize() const {
    if (synchronize_) synchronize_();
  }

 private:
  StepTimes times_;
  StepOps ops_;
  std::function<void()> synchronize_;
};

// Adds the wall seconds of its scope to one phase of the recorder's step.
class PhaseTimer : public ScopedTimer {
 public:
  PhaseTimer(StepRecorder& recorder, Phase phase)
      : ScopedTimer(recorder.seconds(phase)),
        recorder_(recorder),
        counts_(recorder.counts(phase)),
        start_(op_counts()) {}
  // Before ScopedTimer reads the clock. A device error is not thrown from a destructor: it
  // surfaces again at the device's next operation.
  ~PhaseTimer() {
    try {
      recorder_.synchronize();
    } catch (...) {
    }
    counts_ += op_counts() - start_;
  }

 private:
  StepRecorder& recorder_;
  OpCounts& counts_;
  OpCounts start_;
};

}  // namespace mixtrain
