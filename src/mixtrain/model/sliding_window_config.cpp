#include "mixtrain/model/sliding_window_config.h"

#include <string>
#include <utility>

#include "mixtrain/config/leaf.h"
#include "mixtrain/config/section.h"

namespace mixtrain {

void register_sliding_window_section() {
  ConfigSectionSpec spec;
  spec.name = "sliding_window";
  spec.slot = "model";
  spec.leaves = {field_leaf(
      "model.sliding_window",
      [](auto& c) -> auto& { return sliding_window_config(c.model).sliding_window; })};
  spec.check = [](const TrainerConfig& c, const ConfigChecker& check) {
    const int64_t window = sliding_window_config(c.model).sliding_window;
    check.non_negative("model.sliding_window", static_cast<double>(window));
    if (window > 0 && c.parallel.cp > 1) {
      check.fail_value("parallel.cp", "must be 1 with " + check.key("model.sliding_window") + " (" +
                                          std::to_string(window) +
                                          "): context parallelism's ring attention has no "
                                          "sliding window");
    }
  };
  register_config_section(std::move(spec));
}

}  // namespace mixtrain
