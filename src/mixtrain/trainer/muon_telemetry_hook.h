// Muon telemetry as a step hook (optimizer.muon_telemetry; optim/muon_telemetry.h): on log
// steps Muon records a sample of its orthogonalized updates during the optimizer step, and the
// figures are reduced after it (collective, outside the step's timing). figures() holds the
// last step's, empty after a step that was not a log step.
#pragma once

#include <vector>

#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/optim/muon_telemetry.h"
#include "mixtrain/optim/training_optimizer.h"
#include "mixtrain/trainer/step_hook.h"

namespace mixtrain {

class MuonTelemetryHook final : public StepHook {
 public:
  MuonTelemetryHook(TrainingOptimizer& optimizer, const DeviceMesh& mesh)
      : optimizer_(optimizer), mesh_(mesh) {}

  void before_update(int64_t step, bool log_step) override;
  void after_step(int64_t step, bool log_step) override;
  const std::vector<MuonGroupTelemetry>& figures() const { return figures_; }

 private:
  TrainingOptimizer& optimizer_;
  const DeviceMesh& mesh_;
  std::vector<MuonGroupTelemetry> figures_;
};

}  // namespace mixtrain
