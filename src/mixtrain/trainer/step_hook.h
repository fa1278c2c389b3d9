// An optional feature acting around a training step (docs/architecture.md §3): QK-clip
// (qk_clip_hook.h) and Muon telemetry (muon_telemetry_hook.h). The Trainer keeps them in the
// order it installs them and calls each at these points of every step, so the step itself
// reads as the algorithm (forward/backward -> reduce -> clip -> optimizer step):
//   before_forward(step)              before the step's first micro-batch
//   before_update(step, log_step)     gradients ready, before the optimizer step
//   after_update(result)              after the optimizer step and zero_grad, inside the step's
//                                     optimizer phase (timed as the step); may fill `result`
//   after_step(step, log_step)        after the optimizer phase (not timed as the step)
//   before_eval() / after_eval()      around an evaluation's forwards
// Collective hooks are called on every rank alike.
#pragma once

#include <cstdint>

namespace mixtrain {

struct StepResult;

class StepHook {
 public:
  virtual ~StepHook() = default;
  virtual void before_forward(int64_t /*step*/) {}
  virtual void before_update(int64_t /*step*/, bool /*log_step*/) {}
  virtual void after_update(StepResult& /*result*/) {}
  virtual void after_step(int64_t /*step*/, bool /*log_step*/) {}
  virtual void before_eval() {}
  virtual void after_eval() {}
};

}  // namespace mixtrain
