// trainer/muon_telemetry_hook.h: Muon's telemetry is recorded on log steps only, reduced after
// the step, and forgotten at the next step (the figures themselves are optim/muon_telemetry's
// test). The tiny Qwen2-MoE in float32 on one process, Muon + AdamW, random gradients.
#include "mixtrain/trainer/muon_telemetry_hook.h"

#include <gtest/gtest.h>

#include <torch/types.h>

#include <cmath>
#include <cstdint>

#include "support/hook_fixture.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using test_support::HookFixture;

struct TelemetrySetup : HookFixture {
  TelemetrySetup() : HookFixture({"optimizer.muon_telemetry=true"}), hook(*optimizer, mesh) {}

  // One optimizer step with random gradients, the hook around it as the Trainer calls it.
  void step(int64_t step, bool log_step) {
    for (auto& item : model->named_parameters()) {
      item.value().mutable_grad() = at::randn_like(item.value());
    }
    hook.before_update(step, log_step);
    optimizer->step();
    optimizer->zero_grad();
    hook.after_step(step, log_step);
  }

  MuonTelemetryHook hook;
};

TEST(MuonTelemetryHook, FiguresOnLogStepsOnly) {
  at::manual_seed(3);
  TelemetrySetup s;
  s.step(1, false);
  EXPECT_TRUE(s.hook.figures().empty()) << "a step that is not a log step records nothing";
  s.step(2, true);
  ASSERT_FALSE(s.hook.figures().empty());
  for (const MuonGroupTelemetry& g : s.hook.figures()) {
    EXPECT_GT(g.sampled, 0) << "group " << g.group;
    EXPECT_TRUE(std::isfinite(g.ortho_error_mean)) << "group " << g.group;
    EXPECT_TRUE(std::isfinite(g.update_rms) && g.update_rms > 0) << "group " << g.group;
  }
  // The next step forgets them as soon as it starts, log step or not.
  s.hook.before_update(3, false);
  EXPECT_TRUE(s.hook.figures().empty());
  s.step(3, false);
  EXPECT_TRUE(s.hook.figures().empty());
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
