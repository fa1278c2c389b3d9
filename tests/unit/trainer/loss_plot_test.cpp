// Loss plot: the SVG has a title, tick labels and one polyline through the finite points at
// hand-computed pixel positions, and eval points as a second series with a legend; degenerate
// inputs do not divide by zero; the file is written atomically and failures name the path without
// leaving a temporary file.
#include "mixtrain/trainer/loss_plot.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/trainer/evaluator.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;
using Points = std::vector<std::pair<int64_t, double>>;

// The "x,y" pairs of the document's only polyline; empty when there is none.
std::vector<std::string> polyline_points(const std::string& svg) {
  std::vector<std::string> out;
  size_t at = svg.find("<polyline");
  if (at == std::string::npos) return out;
  EXPECT_EQ(svg.find("<polyline", at + 1), std::string::npos) << "more than one polyline";
  size_t begin = svg.find("points=\"", at) + 8;
  size_t end = svg.find('"', begin);
  std::istringstream in(svg.substr(begin, end - begin));
  for (std::string p; in >> p;) out.push_back(p);
  return out;
}

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1))
    ++n;
  return n;
}

bool has_tick_label(const std::string& svg, const std::string& label) {
  return svg.find(">" + label + "</text>") != std::string::npos;
}

void expect_well_formed(const std::string& svg) {
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_NE(svg.find("xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  EXPECT_EQ(count(svg, "<g "), count(svg, "</g>"));
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(LossPlotRender, TwoPointsSpanThePlotArea) {
  // Plot area: x 80..770, y 50 (top) .. 420 (bottom). Steps 0..10 give ticks every 2 (10/5)
  // on 0..10; losses 1..2 give ticks every 0.2 on 1..2. So (0, 1) is the bottom-left corner
  // and (10, 2) the top-right one.
  std::string svg = render_loss_svg({{0, 1.0}, {10, 2.0}}, "tiny run");
  expect_well_formed(svg);
  EXPECT_EQ(polyline_points(svg), (std::vector<std::string>{"80.00,420.00", "770.00,50.00"}));
  EXPECT_NE(svg.find("<title>tiny run</title>"), std::string::npos);
  for (const char* label : {"0", "2", "4", "6", "8", "10"}) {
    EXPECT_TRUE(has_tick_label(svg, label)) << label;
  }
  for (const char* label : {"1.0", "1.2", "1.4", "1.6", "1.8", "2.0"}) {
    EXPECT_TRUE(has_tick_label(svg, label)) << label;
  }
  EXPECT_FALSE(has_tick_label(svg, "2.2"));  // no tick beyond the data from rounding
  EXPECT_FALSE(has_tick_label(svg, "12"));
}

TEST(LossPlotRender, PolylineHasOnePointPerFinitePoint) {
  Points points;
  for (int64_t step = 1; step <= 30; ++step) points.emplace_back(step, 10.0 / step);
  EXPECT_EQ(polyline_points(render_loss_svg(points, "t")).size(), 30u);
}

TEST(LossPlotRender, NonFiniteLossesAreSkipped) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  // Finite points (0, 1) and (10, 2): the same frame as TwoPointsSpanThePlotArea.
  std::string svg = render_loss_svg({{0, 1.0}, {5, nan}, {7, inf}, {10, 2.0}}, "t");
  expect_well_formed(svg);
  EXPECT_EQ(polyline_points(svg), (std::vector<std::string>{"80.00,420.00", "770.00,50.00"}));
}

TEST(LossPlotRender, ConstantLossSitsMidHeight) {
  // Loss 2.0 everywhere: the range is widened by 10% each way to 1.8..2.2 (ticks 0.1), so
  // 2.0 is at mid height 420 - 370 / 2 = 235. Steps 1..3 keep integer ticks on 1..3:
  // x = 80, 425, 770.
  std::string svg = render_loss_svg({{1, 2.0}, {2, 2.0}, {3, 2.0}}, "flat");
  expect_well_formed(svg);
  EXPECT_EQ(polyline_points(svg),
            (std::vector<std::string>{"80.00,235.00", "425.00,235.00", "770.00,235.00"}));
  EXPECT_TRUE(has_tick_label(svg, "1.8"));
  EXPECT_TRUE(has_tick_label(svg, "2.2"));
}

TEST(LossPlotRender, ConstantZeroLoss) {
  // Zero cannot be widened by 10%; it gets +-1, so 0 is again at mid height.
  std::string svg = render_loss_svg({{1, 0.0}, {3, 0.0}}, "zero");
  expect_well_formed(svg);
  EXPECT_EQ(polyline_points(svg), (std::vector<std::string>{"80.00,235.00", "770.00,235.00"}));
  EXPECT_TRUE(has_tick_label(svg, "-1.0"));
  EXPECT_TRUE(has_tick_label(svg, "1.0"));
}

// The eval series shares the axes: train (0, 1) .. (10, 2) spans the plot area as above, so the
// eval points (5, 1.5) and (10, 1.2) sit at x 80 + 0.5 x 690 = 425, 770 and y 420 - 0.5 x 370 =
// 235, 420 - 0.2 x 370 = 346; each gets a dot, and the legend names both series.
TEST(LossPlotRender, EvalPointsAreASecondSeriesWithDotsAndALegend) {
  const std::string svg = render_loss_svg({{0, 1.0}, {10, 2.0}}, "run", {{5, 1.5}, {10, 1.2}});
  expect_well_formed(svg);
  const size_t eval_at = svg.find("<polyline fill=\"none\" stroke=\"#ff7f0e\"");
  ASSERT_NE(eval_at, std::string::npos) << svg;
  EXPECT_EQ(polyline_points(svg.substr(0, eval_at)),
            (std::vector<std::string>{"80.00,420.00", "770.00,50.00"}));
  EXPECT_EQ(polyline_points(svg.substr(eval_at)),
            (std::vector<std::string>{"425.00,235.00", "770.00,346.00"}));
  EXPECT_NE(svg.find("<circle cx=\"425.00\" cy=\"235.00\" r=\"3\" fill=\"#ff7f0e\""),
            std::string::npos);
  EXPECT_NE(svg.find("<circle cx=\"770.00\" cy=\"346.00\" r=\"3\" fill=\"#ff7f0e\""),
            std::string::npos);
  EXPECT_TRUE(has_tick_label(svg, "train"));
  EXPECT_TRUE(has_tick_label(svg, "eval"));
  // Without eval points: one series, no legend.
  EXPECT_FALSE(has_tick_label(render_loss_svg({{0, 1.0}, {10, 2.0}}, "run"), "train"));
}

// Eval points widen the axes like train points: an eval loss above every train loss stays in.
TEST(LossPlotRender, EvalPointsWidenTheAxes) {
  const std::string svg = render_loss_svg({{0, 1.0}, {10, 2.0}}, "run", {{10, 3.0}});
  EXPECT_TRUE(has_tick_label(svg, "3.0")) << svg;
}

TEST(LossPlotRender, SinglePointIsCentredAndMarked) {
  // Step 5 widens to 4..6 (ticks 1), loss 3.0 to 2.7..3.3, which ticks every 0.2 extend to
  // 2.6..3.4: the point is at the centre (425, 235).
  std::string svg = render_loss_svg({{5, 3.0}}, "one");
  expect_well_formed(svg);
  EXPECT_EQ(polyline_points(svg), (std::vector<std::string>{"425.00,235.00"}));
  EXPECT_NE(svg.find("<circle cx=\"425.00\" cy=\"235.00\""), std::string::npos);
  for (const char* label : {"4", "5", "6", "2.6", "2.8", "3.0", "3.2", "3.4"}) {
    EXPECT_TRUE(has_tick_label(svg, label)) << label;
  }
}

TEST(LossPlotRender, NoPointsGivesAnEmptyFrame) {
  for (const Points& points : {Points{}, Points{{1, std::numeric_limits<double>::quiet_NaN()}}}) {
    std::string svg = render_loss_svg(points, "empty");
    expect_well_formed(svg);
    EXPECT_TRUE(polyline_points(svg).empty());
    EXPECT_EQ(svg.find("<polyline"), std::string::npos);
    EXPECT_NE(svg.find(">no data</text>"), std::string::npos);
    EXPECT_NE(svg.find("<title>empty</title>"), std::string::npos);
  }
}

TEST(LossPlotRender, TitleIsEscaped) {
  std::string svg = render_loss_svg({{1, 1.0}, {2, 0.5}}, "run <a> & \"b\"");
  EXPECT_NE(svg.find("<title>run &lt;a&gt; &amp; &quot;b&quot;</title>"), std::string::npos);
  EXPECT_EQ(svg.find("<a>"), std::string::npos);
}

TEST(LossPlotRender, LongRunsKeepTheExtremesOfEachPixelColumn) {
  // 20000 steps alternating between loss 1 and 2: x axis 0..20000 (ticks every 5000), y axis
  // 1..2, so every point is at y 420 or 50. Each of the at most 691 pixel columns (80..770)
  // keeps its lowest and its highest point.
  Points points;
  for (int64_t step = 1; step <= 20000; ++step) points.emplace_back(step, step % 2 ? 1.0 : 2.0);
  std::string svg = render_loss_svg(points, "long");
  expect_well_formed(svg);
  auto pts = polyline_points(svg);
  EXPECT_LE(pts.size(), 2u * 691u);
  EXPECT_GE(pts.size(), 2u * 690u);
  size_t top = 0, bottom = 0;
  for (const auto& p : pts) {
    std::string y = p.substr(p.find(',') + 1);
    if (y == "50.00") ++top;
    if (y == "420.00") ++bottom;
  }
  EXPECT_EQ(top + bottom, pts.size());
  EXPECT_EQ(top, bottom);
  EXPECT_TRUE(has_tick_label(svg, "20000"));
  EXPECT_TRUE(has_tick_label(svg, "5000"));
}

class LossPlotFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "mixtrain_plot_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    return names;
  }

  fs::path dir_;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST_F(LossPlotFileTest, WritesTheRenderedDocumentAndNoTemporaryFile) {
  Points points{{1, 4.0}, {2, 3.0}, {3, 2.5}};
  fs::path path = dir_ / "loss.svg";
  write_loss_svg(path.string(), points, "run");
  EXPECT_EQ(read_file(path), render_loss_svg(points, "run"));
  EXPECT_EQ(entries(), std::vector<std::string>{"loss.svg"});
}

TEST_F(LossPlotFileTest, AsARunHookDrawsTheRowsAndEvaluationsAtTheEnd) {
  const fs::path path = dir_ / "loss.svg";
  LossPlot plot(path.string(), "run");
  for (const auto& [step, loss] : Points{{1, 4.0}, {2, 3.0}, {3, 2.5}}) {
    StepMetrics row;
    row.step = step;
    row.loss = loss;
    plot.on_step(row);
  }
  plot.on_eval(EvalMetrics{2, 3.5, 33.1, 10}, EvalResult{});
  EXPECT_FALSE(fs::exists(path)) << "nothing is written before the end";
  plot.on_end();
  EXPECT_EQ(read_file(path), render_loss_svg({{1, 4.0}, {2, 3.0}, {3, 2.5}}, "run", {{2, 3.5}}));
}

TEST_F(LossPlotFileTest, ReplacesAnExistingPicture) {
  fs::path path = dir_ / "loss.svg";
  std::ofstream(path) << "old";
  write_loss_svg(path.string(), {{1, 1.0}}, "new");
  EXPECT_EQ(read_file(path), render_loss_svg({{1, 1.0}}, "new"));
  EXPECT_EQ(entries(), std::vector<std::string>{"loss.svg"});
}

TEST_F(LossPlotFileTest, MissingDirectoryNamesThePath) {
  std::string path = (dir_ / "no_such_dir" / "loss.svg").string();
  try {
    write_loss_svg(path, {{1, 1.0}}, "t");
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_EQ(entries(), std::vector<std::string>{});
}

TEST_F(LossPlotFileTest, FailedRenameLeavesNoTemporaryFile) {
  // A non-empty directory at the target: the temporary file is written, rename() fails.
  fs::path path = dir_ / "loss.svg";
  fs::create_directories(path / "keep");
  try {
    write_loss_svg(path.string(), {{1, 1.0}}, "t");
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  EXPECT_EQ(entries(), std::vector<std::string>{"loss.svg"});
  EXPECT_TRUE(fs::is_directory(path / "keep"));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
