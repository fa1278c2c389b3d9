// Progress display: terminal mode redraws one line with '\r' and ends it only in finish();
// plain mode prints whole lines every log_every steps and on the last; the ETA uses the rate
// since the first update; format_eta/format_rate on hand-checked values.
#include "mixtrain/trainer/progress.h"

#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

// A FILE* whose contents the test can read at any time. Declare it before the ProgressBar so
// the bar (whose destructor may write) is destroyed first.
class Capture {
 public:
  Capture() : file_(open_memstream(&buf_, &len_)) {}
  ~Capture() {
    std::fclose(file_);
    std::free(buf_);
  }
  std::FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    return std::string(buf_, len_);
  }

 private:
  char* buf_ = nullptr;
  size_t len_ = 0;
  std::FILE* file_;
};

size_t count_char(const std::string& s, char c) {
  return static_cast<size_t>(std::count(s.begin(), s.end(), c));
}

TEST(FormatEta, HandCheckedValues) {
  EXPECT_EQ(format_eta(0), "0:00");
  EXPECT_EQ(format_eta(41), "0:41");
  EXPECT_EQ(format_eta(40.6), "0:41");  // nearest second
  EXPECT_EQ(format_eta(59.4), "0:59");
  EXPECT_EQ(format_eta(59.5), "1:00");
  EXPECT_EQ(format_eta(61), "1:01");
  EXPECT_EQ(format_eta(600), "10:00");
  EXPECT_EQ(format_eta(3599), "59:59");
  EXPECT_EQ(format_eta(3600), "1:00:00");
  EXPECT_EQ(format_eta(3723), "1:02:03");  // 3600 + 2 * 60 + 3
  EXPECT_EQ(format_eta(100 * 3600 + 5), "100:00:05");
}

TEST(FormatEta, UnknownValues) {
  EXPECT_EQ(format_eta(-1), "--:--");
  EXPECT_EQ(format_eta(std::numeric_limits<double>::quiet_NaN()), "--:--");
  EXPECT_EQ(format_eta(std::numeric_limits<double>::infinity()), "--:--");
}

TEST(FormatRate, HandCheckedValues) {
  EXPECT_EQ(format_rate(0), "0 tok/s");
  EXPECT_EQ(format_rate(950), "950 tok/s");
  EXPECT_EQ(format_rate(999.4), "999 tok/s");
  EXPECT_EQ(format_rate(999.7), "1.0k tok/s");  // would round to 1000: next unit
  EXPECT_EQ(format_rate(12345), "12.3k tok/s");
  EXPECT_EQ(format_rate(999949), "999.9k tok/s");
  EXPECT_EQ(format_rate(999951), "1.0M tok/s");
  EXPECT_EQ(format_rate(1.234e6), "1.2M tok/s");
  EXPECT_EQ(format_rate(25e6), "25.0M tok/s");
}

TEST(FormatRate, UnknownValues) {
  EXPECT_EQ(format_rate(-1), "-- tok/s");
  EXPECT_EQ(format_rate(std::numeric_limits<double>::quiet_NaN()), "-- tok/s");
  EXPECT_EQ(format_rate(std::numeric_limits<double>::infinity()), "-- tok/s");
}

TEST(ProgressBarTerminal, RedrawsInPlaceUntilFinish) {
  Capture out;
  ProgressBar bar(100, 10, /*is_terminal=*/true, out.file());
  // 0.5 s per step from the start: at step 12, 88 steps remain, 44 s. 12 of 100 steps fill
  // 12 * 20 / 100 = 2 of the 20 bar cells.
  for (int64_t step = 1; step <= 12; ++step) bar.update(step, 4.1234, 12345, 0.5 * step);
  std::string text = out.text();
  EXPECT_EQ(count_char(text, '\r'), 12u);
  EXPECT_EQ(count_char(text, '\n'), 0u);
  std::string last = text.substr(text.rfind('\r'));
  EXPECT_EQ(last, "\r step 12/100 [##..................] loss 4.1234 | 12.3k tok/s | ETA 0:44");

  bar.finish();
  text = out.text();
  EXPECT_EQ(count_char(text, '\n'), 1u);
  EXPECT_EQ(text.back(), '\n');
  bar.finish();  // idempotent
  EXPECT_EQ(count_char(out.text(), '\n'), 1u);
}

TEST(ProgressBarTerminal, FullBarOnTheLastStep) {
  Capture out;
  ProgressBar bar(4, 1, true, out.file());
  for (int64_t step = 1; step <= 4; ++step) bar.update(step, 1.0, 950, step);
  std::string text = out.text();
  EXPECT_EQ(text.substr(text.rfind('\r')),
            "\r step 4/4 [####################] loss 1.0000 | 950 tok/s | ETA 0:00");
}

TEST(ProgressBarTerminal, ShorterLineOverwritesTheLongerOne) {
  Capture out;
  ProgressBar bar(100, 1, true, out.file());
  bar.update(1, 1234.5, 950, 1.0);
  bar.update(2, 1.0, 950, 2.0);
  std::string text = out.text();
  std::string first = text.substr(0, text.rfind('\r'));
  std::string second = text.substr(text.rfind('\r'));
  // "1234.5000" is 3 characters longer than "1.0000": 3 spaces of padding, same width. One
  // step per second: 98 steps remain at step 2, 98 s = 1:38.
  EXPECT_EQ(second.size(), first.size());
  EXPECT_EQ(second, "\r step 2/100 [....................] loss 1.0000 | 950 tok/s | ETA 1:38   ");
}

TEST(ProgressBarTerminal, DestructorEndsTheLine) {
  Capture out;
  {
    ProgressBar bar(10, 1, true, out.file());
    bar.update(1, 1.0, 1.0, 1.0);
  }
  EXPECT_EQ(out.text().back(), '\n');
}

TEST(ProgressBarTerminal, UnknownTotalHasNoBarAndNoEta) {
  Capture out;
  ProgressBar bar(0, 1, true, out.file());
  bar.update(7, 2.5, 950, 3.0);
  EXPECT_EQ(out.text(), "\r step 7 loss 2.5000 | 950 tok/s");
}

TEST(ProgressBarPlain, PrintsEveryLogEveryStepsAndTheLast) {
  Capture out;
  ProgressBar bar(25, 10, /*is_terminal=*/false, out.file());
  for (int64_t step = 1; step <= 25; ++step) bar.update(step, 2.0, 950, 0.5 * step);
  bar.finish();
  // Steps 10, 20 and the last, 25. 0.5 s per step: at step 10, 15 steps remain (7.5 s,
  // rounded to 8); at 20, 2.5 s rounds to 3; elapsed 12.5 s at the end rounds to 13.
  EXPECT_EQ(out.text(),
            "step 10/25 | loss 2.0000 | 950 tok/s | elapsed 0:05 | ETA 0:08\n"
            "step 20/25 | loss 2.0000 | 950 tok/s | elapsed 0:10 | ETA 0:03\n"
            "step 25/25 | loss 2.0000 | 950 tok/s | elapsed 0:13 | ETA 0:00\n");
}

TEST(ProgressBarPlain, NonPositiveLogEveryPrintsOnlyTheLastStep) {
  Capture out;
  ProgressBar bar(3, 0, false, out.file());
  for (int64_t step = 1; step <= 3; ++step) bar.update(step, 1.0, 950, step);
  EXPECT_EQ(out.text(), "step 3/3 | loss 1.0000 | 950 tok/s | elapsed 0:03 | ETA 0:00\n");
}

TEST(ProgressBarPlain, EtaOfAResumedRunCountsOnlyThisProcessSteps) {
  Capture out;
  ProgressBar bar(2000, 1, false, out.file());
  // First update: step 1001 took 2 s, 999 steps remain: 1998 s = 33:18.
  bar.update(1001, 1.0, 950, 2.0);
  // Then 2 steps in 3 s, 998 remain: 1497 s = 24:57.
  bar.update(1002, 1.0, 950, 3.0);
  EXPECT_EQ(out.text(),
            "step 1001/2000 | loss 1.0000 | 950 tok/s | elapsed 0:02 | ETA 33:18\n"
            "step 1002/2000 | loss 1.0000 | 950 tok/s | elapsed 0:03 | ETA 24:57\n");
}

TEST(ProgressBarPlain, UnknownTotalHasNoEta) {
  Capture out;
  ProgressBar bar(-1, 5, false, out.file());
  for (int64_t step = 1; step <= 5; ++step) bar.update(step, 3.0, 12345, step);
  EXPECT_EQ(out.text(), "step 5 | loss 3.0000 | 12.3k tok/s | elapsed 0:05\n");
}

TEST(ProgressBarPlain, NanLossIsShownNotHidden) {
  Capture out;
  ProgressBar bar(1, 1, false, out.file());
  bar.update(1, std::numeric_limits<double>::quiet_NaN(), 950, 1.0);
  EXPECT_EQ(out.text(), "step 1/1 | loss nan | 950 tok/s | elapsed 0:01 | ETA 0:00\n");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
