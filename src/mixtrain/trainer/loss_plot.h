// A loss-vs-step line chart as a standalone SVG file, with no plotting dependency.
//
// The chart has a title, both axes with "nice" tick labels (1/2/5 x 10^k), and one polyline
// through the finite points in the order given (NaN/Inf losses are skipped). A single point
// is also drawn as a dot; no finite point gives the frame and a "no data" note. Above 4000
// points the polyline keeps only the lowest and highest point of each pixel column: the same
// picture at a bounded file size. Degenerate ranges (one step, a constant loss) are widened so
// nothing divides by zero. Eval points (train.eval_every), when given, are a second series on the
// same axes: an orange polyline with a dot per point, and a legend names both series. The file is
// written atomically: a temporary file in the same directory, fsync, then rename over path, so a
// reader never sees half a picture. The parent directory must exist. Failure throws UserError
// naming the path and leaves no temporary file.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/trainer/run_hook.h"

namespace mixtrain {

void write_loss_svg(const std::string& path, const std::vector<std::pair<int64_t, double>>& points,
                    const std::string& title,
                    const std::vector<std::pair<int64_t, double>>& eval_points = {});

// The SVG document write_loss_svg writes; exposed for tests.
std::string render_loss_svg(const std::vector<std::pair<int64_t, double>>& points,
                            const std::string& title,
                            const std::vector<std::pair<int64_t, double>>& eval_points = {});

// As a run hook (run_hook.h): collects each step's loss and each evaluation's loss and, at the
// end of the run, writes them with write_loss_svg to `path`.
class LossPlot final : public RunHook {
 public:
  LossPlot(std::string path, std::string title)
      : path_(std::move(path)), title_(std::move(title)) {}
  void on_step(const StepMetrics& row) override { points_.emplace_back(row.step, row.loss); }
  void on_eval(const EvalMetrics& row, const EvalResult&) override {
    eval_points_.emplace_back(row.step, row.eval_loss);
  }
  void on_end() override { write_loss_svg(path_, points_, title_, eval_points_); }

 private:
  std::string path_, title_;
  std::vector<std::pair<int64_t, double>> points_, eval_points_;
};

}  // namespace mixtrain
