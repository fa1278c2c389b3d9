// trainer/step_recorder.h: each phase adds to its own field of the step's record.
#include "mixtrain/trainer/step_recorder.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(StepRecorderTest, EachPhaseHasItsOwnField) {
  const std::vector<std::pair<Phase, double StepTimes::*>> fields = {
      {Phase::kForward, &StepTimes::forward_s},     {Phase::kBackward, &StepTimes::backward_s},
      {Phase::kReduce, &StepTimes::reduce_s},       {Phase::kClip, &StepTimes::clip_s},
      {Phase::kOptimizer, &StepTimes::optimizer_s}, {Phase::kCheckpoint, &StepTimes::checkpoint_s},
  };
  for (const auto& [phase, field] : fields) {
    StepRecorder recorder;
    recorder.add(phase, 0.25);
    recorder.add(phase, 0.5);  // a phase entered twice in a step adds up
    StepTimes expected;
    expected.*field = 0.75;
    const StepTimes& got = recorder.times();
    EXPECT_EQ(got.forward_s, expected.forward_s);
    EXPECT_EQ(got.backward_s, expected.backward_s);
    EXPECT_EQ(got.reduce_s, expected.reduce_s);
    EXPECT_EQ(got.clip_s, expected.clip_s);
    EXPECT_EQ(got.optimizer_s, expected.optimizer_s);
    EXPECT_EQ(got.checkpoint_s, expected.checkpoint_s);
    EXPECT_EQ(got.step_s, 0.0);  // the whole step is the caller's to time
  }
}

// train.profile on a device: every phase ends with the synchronisation, inside its own time.
TEST(StepRecorderTest, PhasesEndWithTheSynchronisationInsideTheirTime) {
  StepRecorder recorder;
  int calls = 0;
  recorder.set_synchronize([&] {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a device catching up
  });
  { PhaseTimer t(recorder, Phase::kForward); }
  { PhaseTimer t(recorder, Phase::kOptimizer); }
  EXPECT_EQ(calls, 2);
  EXPECT_GE(recorder.times().forward_s, 0.010);
  EXPECT_GE(recorder.times().optimizer_s, 0.010);
  // A failing synchronisation is not thrown from the timer's destructor.
  recorder.set_synchronize([] { throw std::runtime_error("device lost"); });
  EXPECT_NO_THROW({ PhaseTimer t(recorder, Phase::kClip); });
}

TEST(StepRecorderTest, PhaseTimersAddTheirScopeAndStartClears) {
  StepRecorder recorder;
  for (int micro = 0; micro < 2; ++micro) {
    PhaseTimer t(recorder, Phase::kBackward);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // sleep_for sleeps at least as long as asked.
  EXPECT_GE(recorder.times().backward_s, 0.020);
  EXPECT_EQ(recorder.times().forward_s, 0.0);
  recorder.start();
  EXPECT_EQ(recorder.times().backward_s, 0.0);
}

// train.count_ops: each PhaseTimer adds the ops dispatched in its scope to its phase.
TEST(StepRecorderTest, PhaseTimersAddTheirOpCounts) {
  const at::Tensor a = at::ones({4});
  OpCountScope counting;
  StepRecorder recorder;
  for (int micro = 0; micro < 2; ++micro) {
    {
      PhaseTimer t(recorder, Phase::kForward);
      at::Tensor b = at::add(a, a);  // one op
    }
    {
      PhaseTimer t(recorder, Phase::kBackward);
      at::Tensor b = at::add(a, a);
      at::Tensor c = at::sub(a, a);
    }
  }
  at::Tensor outside = at::add(a, a);  // in no phase
  EXPECT_EQ(recorder.ops().forward.ops, 2);
  EXPECT_EQ(recorder.ops().backward.ops, 4);
  EXPECT_EQ(recorder.ops().optimizer.ops, 0);
  EXPECT_THROW(recorder.counts(Phase::kReduce), std::invalid_argument);  // inside backward
  recorder.start();
  EXPECT_EQ(recorder.ops().backward.ops, 0);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
