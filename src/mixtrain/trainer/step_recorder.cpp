#include "mixtrain/trainer/step_recorder.h"

#include <stdexcept>
#include <string>

namespace mixtrain {

double& StepRecorder::seconds(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return times_.forward_s;
    case Phase::kBackward:
      return times_.backward_s;
    case Phase::kReduce:
      return times_.reduce_s;
    case Phase::kClip:
      return times_.clip_s;
    case Phase::kOptimizer:
      return times_.optimizer_s;
    case Phase::kCheckpoint:
      return times_.checkpoint_s;
  }
  throw std::invalid_argument("StepRecorder: not a phase: " +
                              std::to_string(static_cast<int>(phase)));
}

OpCounts& StepRecorder::counts(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return ops_.forward;
    case Phase::kBackward:
      return ops_.backward;
    case Phase::kClip:
      return ops_.clip;
    case Phase::kOptimizer:
      return ops_.optimizer;
    case Phase::kCheckpoint:
      return ops_.checkpoint;
    case Phase::kReduce:
      break;
  }
  throw std::invalid_argument("StepRecorder: no op counts of their own for phase " +
                              std::to_string(static_cast<int>(phase)));
}

}  // namespace mixtrain
