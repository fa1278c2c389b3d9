// StepProfile: averages of the added steps, "other" as the remainder, the log line's format;
// and the profile fields of a metrics.jsonl line.
#include "mixtrain/trainer/step_profile.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "mixtrain/trainer/metrics_writer.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

StepTimes times(double scale) {
  StepTimes t;
  t.forward_s = 0.125 * scale;
  t.backward_s = 0.25 * scale;
  t.reduce_s = 0.0625 * scale;
  t.clip_s = 0.0 * scale;
  t.optimizer_s = 0.0625 * scale;
  t.checkpoint_s = 0.0;
  t.step_s = 0.5 * scale;
  return t;
}

TEST(StepProfileTest, OtherIsTheRemainderAndNeverNegative) {
  EXPECT_DOUBLE_EQ(times(1).other_s(), 0.0625);
  StepTimes t = times(1);
  t.step_s = 0.4;  // phases summing past the step (clock reads overlap)
  EXPECT_EQ(t.other_s(), 0.0);
}

TEST(StepProfileTest, LogLineAveragesTheAddedSteps) {
  StepProfile profile;
  EXPECT_TRUE(profile.empty());
  EXPECT_EQ(profile.format(), "");
  profile.add(3, times(1), 500);
  profile.add(4, times(3), 500);  // the average step is times(2)
  EXPECT_FALSE(profile.empty());
  EXPECT_EQ(profile.format(),
            "profile steps 3-4: 1.000 s/step = forward 0.250 (25%) | backward 0.500 (50%; "
            "gradient reduce 0.125) | clip 0.000 (0%) | optimizer 0.125 (12%) | checkpoint "
            "0.000 (0%) | other 0.125 (12%) | 500 tok/s");
  profile.clear();
  EXPECT_TRUE(profile.empty());
  profile.add(5, times(2), 2000);
  EXPECT_EQ(profile.format().rfind("profile step 5: 1.000 s/step = ", 0), 0u) << profile.format();
}

// On a device: the window's largest per-step peak (not a sum, not an average) closes the line.
TEST(StepProfileTest, PeakDeviceMemoryIsTheWindowsMaximum) {
  StepProfile profile;
  StepTimes a = times(1), b = times(1);
  a.peak_device_bytes = int64_t{3} << 29;  // 1.5 GiB
  b.peak_device_bytes = int64_t{1} << 30;  // 1 GiB
  profile.add(1, a, 1000);
  profile.add(2, b, 1000);
  const std::string line = profile.format();
  EXPECT_NE(line.find("tok/s | peak device memory 1.50 GiB"), std::string::npos) << line;
  const std::string tail = " | peak device memory 1.50 GiB";  // the line's end
  ASSERT_GE(line.size(), tail.size());
  EXPECT_EQ(line.substr(line.size() - tail.size()), tail) << line;
  StepTimes scaled = a;
  scaled *= 0.5;
  EXPECT_EQ(scaled.peak_device_bytes, a.peak_device_bytes);
  // The CPU (0 bytes): no memory part.
  StepProfile cpu;
  cpu.add(1, times(1), 1000);
  EXPECT_EQ(cpu.format().find("device"), std::string::npos);
}

TEST(StepProfileTest, MetricsLineCarriesTheSplitOnlyWithAProfile) {
  StepMetrics row{2, 0.5, 0.25, 0.125, 1000.0, 2.0, 0.0, 1.0, 0};
  EXPECT_EQ(nlohmann::json::parse(metrics_json_line(row)).size(), 9u);
  row.profile = times(1);
  row.profile->checkpoint_s = 0.03125;
  const auto j = nlohmann::json::parse(metrics_json_line(row));
  EXPECT_EQ(j.size(), 16u);
  EXPECT_DOUBLE_EQ(j["forward_s"].get<double>(), 0.125);
  EXPECT_DOUBLE_EQ(j["backward_s"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(j["reduce_s"].get<double>(), 0.0625);
  EXPECT_DOUBLE_EQ(j["clip_s"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j["optimizer_s"].get<double>(), 0.0625);
  EXPECT_DOUBLE_EQ(j["checkpoint_s"].get<double>(), 0.03125);
  EXPECT_DOUBLE_EQ(j["step_s"].get<double>(), 0.5);
  // Appended after the existing keys, in this order.
  EXPECT_NE(metrics_json_line(row).find("\"skipped_steps\":0,\"forward_s\":0.125,\"backward_s\""),
            std::string::npos);
  // A device run's profile adds the step's peak device bytes, last.
  row.profile->peak_device_bytes = 123456789;
  const auto device = nlohmann::json::parse(metrics_json_line(row));
  EXPECT_EQ(device.size(), 17u);
  EXPECT_EQ(device["peak_device_bytes"].get<int64_t>(), 123456789);
  EXPECT_NE(metrics_json_line(row).find("\"step_s\":0.5,\"peak_device_bytes\":123456789}"),
            std::string::npos);
}

TEST(StepProfileTest, StepOpsOtherIsTheStepLessItsPhasesAndTheLineSaysEach) {
  StepOps ops;
  ops.forward = {100, 10};
  ops.backward = {200, 20};
  ops.clip = {5, 1};
  ops.optimizer = {50, 4};
  ops.checkpoint = {0, 0};
  ops.step = {400, 40};
  ops.collectives = 3;
  EXPECT_EQ(ops.other().ops, 400 - 100 - 200 - 5 - 50);
  EXPECT_EQ(ops.other().allocations, 40 - 10 - 20 - 1 - 4);
  EXPECT_EQ(ops.format(7),
            "op counts step 7: 400 ops = forward 100 | backward 200 | clip 5 | optimizer 50 | "
            "checkpoint 0 | other 45; 40 allocations = forward 10 | backward 20 | clip 1 | "
            "optimizer 4 | checkpoint 0 | other 5; 3 collectives");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
