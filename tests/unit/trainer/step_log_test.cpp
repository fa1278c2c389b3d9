// trainer/step_log.h: which rows give which log line, with the figures written as the row has
// them (the lines' formats are the features' own: format_muon_telemetry, format_eval_result,
// StepProfile::format, each tested in its file).
#include "mixtrain/trainer/step_log.h"

#include <gtest/gtest.h>

#include <string>

#include "mixtrain/optim/muon_telemetry.h"
#include "mixtrain/trainer/evaluator.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

// The log lines `body` writes to stderr.
template <typename Body>
std::string logged(Body body) {
  ::testing::internal::CaptureStderr();
  body();
  return ::testing::internal::GetCapturedStderr();
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

StepMetrics row_at(int64_t step) {
  StepMetrics row;
  row.step = step;
  return row;
}

TEST(StepLog, QkClipOnLogStepsOnly) {
  StepLog log(/*log_every=*/2, /*steps=*/5);
  StepMetrics row = row_at(1);
  row.qk_clip = QkClipMetrics{3, 12.5};
  EXPECT_EQ(logged([&] { log.on_step(row); }), "") << "step 1 is not a log step";
  row.step = 2;
  EXPECT_NE(logged([&] {
              log.on_step(row);
            }).find("step 2 QK-clip: max attention logit 12.5, 3 head(s) clipped"),
            std::string::npos);
  row.step = 5;  // the last step is a log step
  EXPECT_EQ(count(logged([&] { log.on_step(row); }), "step 5 QK-clip"), 1);
  EXPECT_EQ(logged([&] { log.on_step(row_at(4)); }), "") << "no QK-clip, no telemetry: no line";
}

TEST(StepLog, MuonTelemetryWheneverTheRowHasFigures) {
  StepLog log(2, 5);
  StepMetrics row = row_at(3);  // the telemetry hook fills rows of log steps only
  MuonGroupTelemetry g;
  g.group = 0;
  g.sampled = 4;
  g.ortho_error_mean = 0.25;
  g.ortho_error_max = 0.5;
  g.update_rms = 1e-3;
  row.muon = {g};
  EXPECT_NE(logged([&] { log.on_step(row); }).find("step 3: " + format_muon_telemetry(row.muon)),
            std::string::npos);
}

TEST(StepLog, EveryEvaluation) {
  StepLog log(2, 5);
  EvalResult result;
  result.loss_sum = 6.0;
  result.tokens = 3;
  const std::string text = logged([&] { log.on_eval(EvalMetrics{3, 2.0, 7.39, 3}, result); });
  EXPECT_NE(text.find("eval at step 3: " + format_eval_result(result)), std::string::npos);
}

TEST(ProfileLog, AveragesTheRowsSinceTheLastLogStep) {
  ProfileLog log(/*log_every=*/2, /*steps=*/3, /*tokens_per_step=*/100);
  StepMetrics row = row_at(1);
  row.profile = StepTimes{};
  row.profile->forward_s = 1.0;
  row.profile->step_s = 2.0;
  EXPECT_EQ(logged([&] { log.on_step(row); }), "");
  row.step = 2;
  row.profile->forward_s = 3.0;
  row.profile->step_s = 4.0;
  // Independently: StepProfile over the same two rows.
  StepProfile expected;
  StepTimes first{};
  first.forward_s = 1.0;
  first.step_s = 2.0;
  expected.add(1, first, 100);
  expected.add(2, *row.profile, 100);
  EXPECT_NE(logged([&] { log.on_step(row); }).find(expected.format()), std::string::npos);
  // Restarted: step 3 (the last) is averaged alone.
  row.step = 3;
  StepProfile alone;
  alone.add(3, *row.profile, 100);
  EXPECT_NE(logged([&] { log.on_step(row); }).find(alone.format()), std::string::npos);
  EXPECT_EQ(logged([&] { log.on_step(row_at(4)); }), "") << "a row without a profile";
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
