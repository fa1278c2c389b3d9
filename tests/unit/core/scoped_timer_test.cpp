// core/scoped_timer.h: a scope's seconds are added to its total, exceptions included.
#include "mixtrain/core/scoped_timer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using namespace std::chrono_literals;

// sleep_for sleeps at least as long as asked; the upper bounds only catch a timer that adds
// something else (a second of slack for a loaded machine).
constexpr double kSlack = 1.0;

TEST(ScopedTimerTest, AddsEachScopeToTheTotal) {
  double total = 1.5;
  {
    ScopedTimer t(total);
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_GE(total, 1.5 + 0.020);
  EXPECT_LT(total, 1.5 + 0.020 + kSlack);
  const double after_one = total;
  {
    ScopedTimer t(total);
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_GE(total, after_one + 0.010);
  EXPECT_LT(total, after_one + 0.010 + kSlack);
}

TEST(ScopedTimerTest, CountsAScopeLeftByAnException) {
  double total = 0.0;
  EXPECT_THROW(
      {
        ScopedTimer t(total);
        std::this_thread::sleep_for(10ms);
        throw std::runtime_error("phase failed");
      },
      std::runtime_error);
  EXPECT_GE(total, 0.010);
}

TEST(StopwatchTest, ReadsSecondsSinceItsStart) {
  const Stopwatch outer;
  std::this_thread::sleep_for(10ms);
  const Stopwatch inner;
  std::this_thread::sleep_for(10ms);
  const auto now = Stopwatch::Clock::now();
  EXPECT_GE(inner.seconds(now), 0.010);
  EXPECT_GE(outer.seconds(now) - inner.seconds(now), 0.010);  // one clock read for both
  EXPECT_LT(outer.seconds(now), 0.020 + kSlack);
  EXPECT_GE(outer.seconds(), outer.seconds(now));  // later reads never go back
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
