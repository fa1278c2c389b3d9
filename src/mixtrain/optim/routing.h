// Which leaf optimizer updates each trainable parameter, with its lr and weight decay
// (docs/architecture.md §5; fp32-main-params §7.1: the wrapper acts after routing), as the
// optimizer table (optimizer_table.h) says:
//
// optimizer._target_ selects a table entry; its routing rule, if it has one, picks the entry
// of each parameter (Muon: muon_routing.h), otherwise every trainable parameter goes to it.
// lr and weight decay are that entry's, except that under the YAML dialect an entry with
// yaml_no_decay gives is_no_decay_parameter names weight decay 0. (toml: the front end put the
// shared weight_decay into both AdamW's and Muon's fields and torchtitan applies it to every
// parameter.)
// Parameters with requires_grad false are not routed. A target with a rule that routes nothing
// to the target itself is a ConfigError naming optimizer._target_.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

struct RouteEntry {
  std::string name;
  std::vector<int64_t> shape;
  c10::ScalarType dtype;
  std::string optimizer;  // the table entry's name: "adamw", "muon", "sgd"
  double lr;
  double weight_decay;
};

// One entry per trainable parameter, in model order. Throws ConfigError carrying the key
// (core/error.h ConfigKey) for an unknown target or routing dialect (optimizer._target_,
// optimizer.routing), and for a Muon target with no Muon parameter (optimizer._target_).
std::vector<RouteEntry> route_parameters(
    const std::vector<std::pair<std::string, at::Tensor>>& named_params,
    const OptimizerConfig& config);

// Text table, one line per entry after a header: name, shape, dtype, optimizer, lr,
// weight decay, in aligned columns (logged at start).
std::string format_routing_table(const std::vector<RouteEntry>& routes);

}  // namespace mixtrain
