#include "mixtrain/trainer/loss_plot.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "mixtrain/core/posix_file.h"

namespace mixtrain {
namespace {

// Canvas and plot-area geometry in SVG user units (pixels).
constexpr double kWidth = 800;
constexpr double kHeight = 480;
constexpr double kLeft = 80;  // room for y tick labels and the "loss" label
constexpr double kRight = 770;
constexpr double kTop = 50;      // room for the title
constexpr double kBottom = 420;  // room for x tick labels and the "step" label
// Above this many points the polyline keeps, per pixel column, only the lowest and highest
// point: the picture is the same, and a long run does not produce a many-megabyte file.
constexpr size_t kMaxPlainPoints = 4000;
constexpr const char* kTrainColor = "#1f77b4";
constexpr const char* kEvalColor = "#ff7f0e";

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// An axis range [lo, hi] extended to whole multiples of a 1/2/5 x 10^k tick spacing.
struct Axis {
  double lo;
  double hi;
  std::vector<double> ticks;
  int decimals;  // digits after the point that the spacing needs; -1: use %g
};

double nice_spacing(double raw) {
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double f = raw / magnitude;
  // Round the spacing up, so there are at most about kTargetTicks intervals; the slack keeps
  // an exact 2.0 that arrives as 2.0000000000000004 from becoming 5.
  constexpr double kSlack = 1e-9;
  double nice = f <= 1 + kSlack ? 1 : f <= 2 + kSlack ? 2 : f <= 5 + kSlack ? 5 : 10;
  return nice * magnitude;
}

// lo < hi, both finite. integer_ticks: the spacing is at least 1 (steps are integers).
Axis make_axis(double lo, double hi, bool integer_ticks) {
  constexpr int kTargetTicks = 5;
  double spacing = nice_spacing((hi - lo) / kTargetTicks);
  if (integer_ticks) spacing = std::max(spacing, 1.0);
  // The slack absorbs rounding in lo / spacing (2.0 / 0.2 is not exactly 10), which would
  // otherwise add a tick beyond the data.
  double axis_lo = std::floor(lo / spacing + 1e-9) * spacing;
  double axis_hi = std::ceil(hi / spacing - 1e-9) * spacing;
  double count = std::round((axis_hi - axis_lo) / spacing);
  Axis axis;
  // Extreme ranges (values near the double limit, overflowed spans) get plain end ticks
  // rather than a loop of unbounded length.
  if (!std::isfinite(spacing) || spacing <= 0 || !std::isfinite(count) || count < 1 || count > 20 ||
      !std::isfinite(axis_lo) || !std::isfinite(axis_hi)) {
    axis.lo = lo;
    axis.hi = hi;
    axis.ticks = {lo, hi};
    axis.decimals = -1;
    return axis;
  }
  axis.lo = axis_lo;
  axis.hi = axis_hi;
  for (int i = 0; i <= static_cast<int>(count); ++i) axis.ticks.push_back(axis_lo + i * spacing);
  axis.decimals = std::max(0, static_cast<int>(-std::floor(std::log10(spacing) + 1e-9)));
  return axis;
}

std::string tick_label(double value, int decimals) {
  double magnitude = std::fabs(value);
  if (decimals < 0 || magnitude >= 1e7 || decimals > 6) return fmt("%.4g", value);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, value);
  std::string s = buf;
  if (s == "-0" || s.rfind("-0.", 0) == 0) {  // -0.00 from rounding error near zero
    if (std::strtod(s.c_str(), nullptr) == 0.0) s.erase(0, 1);
  }
  return s;
}

// Per pixel column keep the lowest and the highest point, in their original order.
std::vector<std::pair<double, double>> decimate(const std::vector<std::pair<double, double>>& px) {
  if (px.size() <= kMaxPlainPoints) return px;
  std::vector<std::pair<double, double>> out;
  size_t i = 0;
  while (i < px.size()) {
    long column = std::lround(px[i].first);
    size_t top = i;  // highest loss in the column (smallest y pixel)
    size_t bottom = i;
    size_t j = i;
    for (; j < px.size() && std::lround(px[j].first) == column; ++j) {
      if (px[j].second < px[top].second) top = j;
      if (px[j].second > px[bottom].second) bottom = j;
    }
    out.push_back(px[std::min(top, bottom)]);
    if (top != bottom) out.push_back(px[std::max(top, bottom)]);
    i = j;
  }
  return out;
}

std::vector<std::pair<double, double>> finite_points(
    const std::vector<std::pair<int64_t, double>>& points) {
  std::vector<std::pair<double, double>> finite;
  finite.reserve(points.size());
  for (const auto& [step, loss] : points) {
    if (std::isfinite(loss)) finite.emplace_back(static_cast<double>(step), loss);
  }
  return finite;
}

// A series' polyline, with a dot on every point when `dots` (or when it has one point: a
// one-point polyline draws nothing).
std::string series_svg(const std::vector<std::pair<double, double>>& pixels, const char* color,
                       bool dots) {
  std::string s = "<polyline fill=\"none\" stroke=\"" + std::string(color) +
                  "\" stroke-width=\"1.5\" points=\"";
  for (size_t i = 0; i < pixels.size(); ++i) {
    if (i) s += ' ';
    s += fmt("%.2f", pixels[i].first) + "," + fmt("%.2f", pixels[i].second);
  }
  s += "\"/>\n";
  if (dots || pixels.size() == 1) {
    for (const auto& [x, y] : pixels) {
      s += "<circle cx=\"" + fmt("%.2f", x) + "\" cy=\"" + fmt("%.2f", y) + "\" r=\"3\" fill=\"" +
           color + "\"/>\n";
    }
  }
  return s;
}

}  // namespace

std::string render_loss_svg(const std::vector<std::pair<int64_t, double>>& points,
                            const std::string& title,
                            const std::vector<std::pair<int64_t, double>>& eval_points) {
  const std::vector<std::pair<double, double>> finite = finite_points(points);
  const std::vector<std::pair<double, double>> eval = finite_points(eval_points);

  double x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
  if (!finite.empty() || !eval.empty()) {
    x_lo = y_lo = std::numeric_limits<double>::infinity();
    x_hi = y_hi = -std::numeric_limits<double>::infinity();
    std::vector<std::pair<double, double>> all = finite;
    all.insert(all.end(), eval.begin(), eval.end());
    for (const auto& [x, y] : all) {
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  }
  // A single step or a constant loss would give a zero-width range: widen it so the point
  // sits in the middle of the plot instead of dividing by zero.
  if (x_hi == x_lo) {
    x_lo -= 1;
    x_hi += 1;
  }
  if (y_hi == y_lo) {
    double pad = y_lo == 0 ? 1.0 : std::fabs(y_lo) * 0.1;
    y_lo -= pad;
    y_hi += pad;
  }
  Axis xa = make_axis(x_lo, x_hi, /*integer_ticks=*/true);
  Axis ya = make_axis(y_lo, y_hi, /*integer_ticks=*/false);

  auto px = [&](double x) { return kLeft + (x - xa.lo) / (xa.hi - xa.lo) * (kRight - kLeft); };
  auto py = [&](double y) { return kBottom - (y - ya.lo) / (ya.hi - ya.lo) * (kBottom - kTop); };

  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", kWidth) + "\" height=\"" +
       fmt("%.0f", kHeight) + "\" viewBox=\"0 0 " + fmt("%.0f", kWidth) + " " +
       fmt("%.0f", kHeight) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<title>" + xml_escape(title) + "</title>\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + fmt("%.1f", (kLeft + kRight) / 2) +
       "\" y=\"30\" text-anchor=\"middle\" font-size=\"16\">" + xml_escape(title) + "</text>\n";

  // Grid lines and tick labels.
  s += "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n";
  for (double t : xa.ticks) {
    std::string x = fmt("%.2f", px(t));
    s += "<line x1=\"" + x + "\" y1=\"" + fmt("%.0f", kTop) + "\" x2=\"" + x + "\" y2=\"" +
         fmt("%.0f", kBottom) + "\"/>\n";
  }
  for (double t : ya.ticks) {
    std::string y = fmt("%.2f", py(t));
    s += "<line x1=\"" + fmt("%.0f", kLeft) + "\" y1=\"" + y + "\" x2=\"" + fmt("%.0f", kRight) +
         "\" y2=\"" + y + "\"/>\n";
  }
  s += "</g>\n<g fill=\"#333\">\n";
  for (double t : xa.ticks) {
    s += "<text x=\"" + fmt("%.2f", px(t)) + "\" y=\"" + fmt("%.0f", kBottom + 18) +
         "\" text-anchor=\"middle\">" + tick_label(t, xa.decimals) + "</text>\n";
  }
  for (double t : ya.ticks) {
    s += "<text x=\"" + fmt("%.0f", kLeft - 8) + "\" y=\"" + fmt("%.2f", py(t) + 4) +
         "\" text-anchor=\"end\">" + tick_label(t, ya.decimals) + "</text>\n";
  }
  s += "<text x=\"" + fmt("%.1f", (kLeft + kRight) / 2) + "\" y=\"" + fmt("%.0f", kHeight - 15) +
       "\" text-anchor=\"middle\">step</text>\n";
  s += "<text x=\"20\" y=\"" + fmt("%.1f", (kTop + kBottom) / 2) + "\" text-anchor=\"middle\" " +
       "transform=\"rotate(-90 20 " + fmt("%.1f", (kTop + kBottom) / 2) + ")\">loss</text>\n";
  s += "</g>\n";

  // Axes.
  s += "<path d=\"M" + fmt("%.0f", kLeft) + " " + fmt("%.0f", kTop) + " V" + fmt("%.0f", kBottom) +
       " H" + fmt("%.0f", kRight) + "\" fill=\"none\" stroke=\"#333\" stroke-width=\"1\"/>\n";

  if (finite.empty() && eval.empty()) {
    s += "<text x=\"" + fmt("%.1f", (kLeft + kRight) / 2) + "\" y=\"" +
         fmt("%.1f", (kTop + kBottom) / 2) + "\" text-anchor=\"middle\" fill=\"#888\">" +
         "no data</text>\n";
  }
  if (!finite.empty()) {
    std::vector<std::pair<double, double>> pixels;
    pixels.reserve(finite.size());
    for (const auto& [x, y] : finite) pixels.emplace_back(px(x), py(y));
    s += series_svg(decimate(pixels), kTrainColor, /*dots=*/false);
  }
  if (!eval.empty()) {
    std::vector<std::pair<double, double>> pixels;
    for (const auto& [x, y] : eval) pixels.emplace_back(px(x), py(y));
    s += series_svg(decimate(pixels), kEvalColor, /*dots=*/true);
    // The legend, top right inside the plot area.
    const double x = kRight - 70;
    for (int row = 0; row < 2; ++row) {
      const double y = kTop + 15 + 16 * row;
      const char* color = row == 0 ? kTrainColor : kEvalColor;
      s += "<line x1=\"" + fmt("%.0f", x) + "\" y1=\"" + fmt("%.0f", y - 4) + "\" x2=\"" +
           fmt("%.0f", x + 20) + "\" y2=\"" + fmt("%.0f", y - 4) + "\" stroke=\"" + color +
           "\" stroke-width=\"2\"/>\n";
      s += "<text x=\"" + fmt("%.0f", x + 26) + "\" y=\"" + fmt("%.0f", y) + "\" fill=\"#333\">" +
           (row == 0 ? "train" : "eval") + "</text>\n";
    }
  }
  s += "</svg>\n";
  return s;
}

void write_loss_svg(const std::string& path, const std::vector<std::pair<int64_t, double>>& points,
                    const std::string& title,
                    const std::vector<std::pair<int64_t, double>>& eval_points) {
  const std::string svg = render_loss_svg(points, title, eval_points);
  // Same directory as the target so rename() is atomic (no cross-filesystem copy); the pid
  // keeps two processes writing the same picture from sharing a temporary file.
  AtomicFile file(path, path + ".tmp." + std::to_string(::getpid()));
  file.write(svg);
  file.publish(/*sync_directory=*/false);
}

}  // namespace mixtrain
