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

namespace mixtrain {

void write_loss_svg(const std::string& path, const std::vector<std::pair<int64_t, double>>& points,
                    const std::string& title,
                    const std::vector<std::pair<int64_t, double>>& eval_points = {});

// The SVG document write_loss_svg writes; exposed for tests.
std::string render_loss_svg(const std::vector<std::pair<int64_t, double>>& points,
                            const std::string& title,
                            const std::vector<std::pair<int64_t, double>>& eval_points = {});

}  // namespace mixtrain
