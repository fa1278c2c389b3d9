// Expected factors are worked out by hand from the formula in lr_schedule.h
// (warmup 10, total 110, so the decay runs over 100 steps; min_lr_ratio m = 0.1).
#include "mixtrain/optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

// The cosine values below are written to 8 decimals.
constexpr double kTol = 1e-8;

LrSchedulerConfig config(const std::string& decay, int64_t warmup = 10, double m = 0.1) {
  LrSchedulerConfig c;
  c.decay = decay;
  c.warmup_steps = warmup;
  c.min_lr_ratio = m;
  return c;
}

TEST(LrScheduleTest, WarmupRampsLinearlyToOneAtWarmupSteps) {
  for (const char* decay : {"constant", "linear", "cosine"}) {
    LrSchedule s(config(decay), 110);
    EXPECT_DOUBLE_EQ(s.factor(1), 0.1) << decay;
    EXPECT_DOUBLE_EQ(s.factor(5), 0.5) << decay;
    EXPECT_DOUBLE_EQ(s.factor(10), 1.0) << decay;
  }
}

TEST(LrScheduleTest, ConstantStaysAtOneAfterWarmup) {
  LrSchedule s(config("constant"), 110);
  EXPECT_DOUBLE_EQ(s.factor(11), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(110), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(500), 1.0);
}

TEST(LrScheduleTest, LinearDecaysToMinRatio) {
  LrSchedule s(config("linear"), 110);
  EXPECT_NEAR(s.factor(35), 0.775, kTol);  // p = 0.25: 1 - 0.9 * 0.25
  EXPECT_NEAR(s.factor(60), 0.55, kTol);   // p = 0.5
  EXPECT_NEAR(s.factor(110), 0.1, kTol);   // p = 1: the last step runs at m
  EXPECT_NEAR(s.factor(1000), 0.1, kTol);  // clamped past the end
}

TEST(LrScheduleTest, CosineDecaysToMinRatio) {
  LrSchedule s(config("cosine"), 110);
  // p = 0.01: cos(0.0314159265) = 0.99950656; 0.1 + 0.9 * 1.99950656 / 2
  EXPECT_NEAR(s.factor(11), 0.99977795, kTol);
  // p = 0.25: cos(pi/4) = 0.70710678; 0.1 + 0.9 * 1.70710678 / 2
  EXPECT_NEAR(s.factor(35), 0.86819805, kTol);
  EXPECT_NEAR(s.factor(60), 0.55, kTol);  // p = 0.5: cos = 0
  // p = 0.75: 0.1 + 0.9 * 0.29289322 / 2
  EXPECT_NEAR(s.factor(85), 0.23180195, kTol);
  EXPECT_NEAR(s.factor(110), 0.1, kTol);
  EXPECT_NEAR(s.factor(111), 0.1, kTol);
}

TEST(LrScheduleTest, NoWarmupStartsDecayingAtStepOne) {
  LrSchedule s(config("linear", 0), 100);
  EXPECT_NEAR(s.factor(1), 0.991, kTol);  // p = 1/100: 1 - 0.9 * 0.01
  EXPECT_NEAR(s.factor(100), 0.1, kTol);
}

TEST(LrScheduleTest, TrainingShorterThanWarmupNeverDecays) {
  LrSchedule s(config("cosine", 10), 5);
  EXPECT_DOUBLE_EQ(s.factor(5), 0.5);  // still warming up at the last step
  LrSchedule at_end(config("cosine", 10), 10);
  EXPECT_DOUBLE_EQ(at_end.factor(10), 1.0);
  EXPECT_NEAR(at_end.factor(11), 0.1, kTol);  // no decay steps: p = 1
}

TEST(LrScheduleTest, MinRatioZeroReachesZero) {
  LrSchedule s(config("cosine", 0, 0.0), 4);
  EXPECT_NEAR(s.factor(2), 0.5, kTol);  // p = 0.5
  EXPECT_NEAR(s.factor(4), 0.0, kTol);
}

// The config keys are validate_config's to name (validate_test.cpp); here the class refuses the
// same values as its own invariants, without a key name.
TEST(LrScheduleTest, InvalidSettingsAreInvalidArguments) {
  auto message = [](const LrSchedulerConfig& c, int64_t total) {
    try {
      LrSchedule s(c, total);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(config("step"), 10),
            "LrSchedule: decay 'step' is not one of constant, linear, cosine");
  EXPECT_EQ(message(config("cosine", -1), 10), "LrSchedule: warmup_steps must be >= 0, got -1");
  EXPECT_EQ(message(config("cosine", 10, 1.5), 10),
            "LrSchedule: min_lr_ratio must be in [0, 1], got 1.500000");
  EXPECT_EQ(message(config("cosine"), 0), "LrSchedule: total_steps must be >= 1, got 0");
}

TEST(LrScheduleTest, StepIsOneBased) {
  LrSchedule s(config("cosine"), 110);
  EXPECT_THROW(s.factor(0), std::invalid_argument);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
