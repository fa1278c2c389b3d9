#include "mixtrain/trainer/muon_telemetry_hook.h"

#include "mixtrain/optim/chained_optimizer.h"

namespace mixtrain {

void MuonTelemetryHook::before_update(int64_t, bool log_step) {
  figures_.clear();
  if (log_step) arm_muon_telemetry(optimizer_.chained());
}

void MuonTelemetryHook::after_step(int64_t, bool log_step) {
  if (log_step) figures_ = muon_step_telemetry(optimizer_.chained(), mesh_.world.get());
}

}  // namespace mixtrain
