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

}  // namespace mixtrain
