// Wall-clock timing on the steady clock: a Stopwatch reads the seconds since it started; a
// ScopedTimer adds the seconds of its scope to a total when the scope ends (exceptions
// included), so a phase is timed by declaring one at its top.
#pragma once

#include <chrono>

namespace mixtrain {

class Stopwatch {
 public:
  using Clock = std::chrono::steady_clock;

  Stopwatch() : start_(Clock::now()) {}
  // Seconds from the start to `until` (one clock read shared by several stopwatches).
  double seconds(Clock::time_point until = Clock::now()) const {
    return std::chrono::duration<double>(until - start_).count();
  }

 private:
  Clock::time_point start_;
};

class ScopedTimer {
 public:
  explicit ScopedTimer(double& total) : total_(total) {}
  ~ScopedTimer() { total_ += watch_.seconds(); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double& total_;
  Stopwatch watch_;
};

}  // namespace mixtrain
