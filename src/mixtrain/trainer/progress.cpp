#include "mixtrain/trainer/progress.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <limits>

namespace mixtrain {
namespace {

constexpr int kBarWidth = 20;

std::string printf_string(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

std::string step_text(int64_t step, int64_t total) {
  char buf[64];
  if (total > 0) {
    std::snprintf(buf, sizeof(buf), "step %" PRId64 "/%" PRId64, step, total);
  } else {
    std::snprintf(buf, sizeof(buf), "step %" PRId64, step);
  }
  return buf;
}

}  // namespace

std::string format_eta(double seconds) {
  // 1e12 s is far beyond any run; the bound keeps the cast to int64 defined.
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e12) return "--:--";
  int64_t total = std::llround(seconds);
  int64_t h = total / 3600;
  int64_t m = total / 60 % 60;
  int64_t s = total % 60;
  char buf[64];
  if (h > 0) {
    std::snprintf(buf, sizeof(buf), "%" PRId64 ":%02" PRId64 ":%02" PRId64, h, m, s);
  } else {
    std::snprintf(buf, sizeof(buf), "%" PRId64 ":%02" PRId64, m, s);
  }
  return buf;
}

std::string format_rate(double tokens_per_s) {
  if (!std::isfinite(tokens_per_s) || tokens_per_s < 0) return "-- tok/s";
  // The unit is chosen after rounding, so 999.7 prints "1.0k", not "1000".
  if (tokens_per_s < 999.5) return printf_string("%.0f tok/s", tokens_per_s);
  if (tokens_per_s < 999950) return printf_string("%.1fk tok/s", tokens_per_s / 1e3);
  return printf_string("%.1fM tok/s", tokens_per_s / 1e6);
}

ProgressBar::ProgressBar(int64_t total_steps, int64_t log_every, bool is_terminal, std::FILE* out)
    : total_steps_(total_steps), log_every_(log_every), is_terminal_(is_terminal), out_(out) {}

ProgressBar::~ProgressBar() {
  finish();
}

double ProgressBar::eta_seconds(int64_t step, double elapsed_s) const {
  if (total_steps_ <= 0 || step <= base_step_) return std::numeric_limits<double>::quiet_NaN();
  double per_step = elapsed_s / static_cast<double>(step - base_step_);
  return per_step * static_cast<double>(std::max<int64_t>(0, total_steps_ - step));
}

void ProgressBar::update(int64_t step, double loss, double tokens_per_s, double elapsed_s) {
  if (!started_) {
    // The first reported step took place between loop start (elapsed 0) and now.
    started_ = true;
    base_step_ = step - 1;
  }
  const bool last = total_steps_ > 0 && step >= total_steps_;
  const std::string loss_text = printf_string("loss %.4f", loss);
  const std::string rate_text = format_rate(tokens_per_s);

  if (is_terminal_) {
    std::string line = " " + step_text(step, total_steps_);
    if (total_steps_ > 0) {
      int64_t filled = std::clamp<int64_t>(step * kBarWidth / total_steps_, 0, kBarWidth);
      line += " [" + std::string(filled, '#') + std::string(kBarWidth - filled, '.') + "]";
    }
    line += " " + loss_text + " | " + rate_text;
    if (total_steps_ > 0) line += " | ETA " + format_eta(eta_seconds(step, elapsed_s));
    const size_t width = line.size();
    // Overwrite what a longer previous draw left at the end of the line.
    if (width < last_width_) line.append(last_width_ - width, ' ');
    last_width_ = width;
    std::fputc('\r', out_);
    std::fputs(line.c_str(), out_);
    line_open_ = true;
    std::fflush(out_);
    return;
  }

  const bool due = log_every_ > 0 && step % log_every_ == 0;
  if (!due && !last) return;
  std::string line = step_text(step, total_steps_) + " | " + loss_text + " | " + rate_text +
                     " | elapsed " + format_eta(elapsed_s);
  if (total_steps_ > 0) line += " | ETA " + format_eta(eta_seconds(step, elapsed_s));
  line += '\n';
  std::fputs(line.c_str(), out_);
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (!line_open_) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  line_open_ = false;
  last_width_ = 0;
}

}  // namespace mixtrain
