#include "mixtrain/optim/routing.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/text.h"
#include "mixtrain/optim/optimizer_table.h"
#include "mixtrain/optim/param_groups.h"

namespace mixtrain {
namespace {

std::string format_stream_number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

std::vector<RouteEntry> route_parameters(
    const std::vector<std::pair<std::string, at::Tensor>>& named_params,
    const OptimizerConfig& config) {
  const OptimizerTableEntry& target = optimizer_for_target(config.target);
  if (config.routing != "yaml" && config.routing != "toml")
    throw ConfigError(ConfigKey{"optimizer.routing"},
                      "unknown routing dialect '" + config.routing + "' (expected yaml or toml)");
  const bool yaml = config.routing == "yaml";

  std::vector<RouteEntry> routes;
  bool any_to_target = false;
  for (const auto& [name, param] : named_params) {
    if (!param.requires_grad()) continue;
    const OptimizerTableEntry& entry =
        target.rule == nullptr
            ? target
            : optimizer_named(target.rule->route(to_lower(name), param.dim(), config));
    any_to_target = any_to_target || &entry == &target;
    RouteEntry route;
    route.name = name;
    route.shape = param.sizes().vec();
    route.dtype = param.scalar_type();
    route.optimizer = entry.name;
    route.lr = entry.lr(config);
    route.weight_decay = entry.yaml_no_decay && yaml && is_no_decay_parameter(name)
                             ? 0.0
                             : entry.weight_decay(config);
    routes.push_back(std::move(route));
  }
  if (target.rule != nullptr && !any_to_target)
    throw ConfigError(ConfigKey{"optimizer._target_"}, target.rule->none_routed(config));
  return routes;
}

std::string format_routing_table(const std::vector<RouteEntry>& routes) {
  const std::vector<std::string> header = {"name",      "shape", "dtype",
                                           "optimizer", "lr",    "weight_decay"};
  std::vector<std::vector<std::string>> rows = {header};
  for (const auto& route : routes) {
    rows.push_back({route.name, format_list(route.shape), dtype_name(route.dtype), route.optimizer,
                    format_stream_number(route.lr), format_stream_number(route.weight_decay)});
  }
  std::vector<size_t> widths(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::ostringstream out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    out << line << '\n';
  }
  return out.str();
}

}  // namespace mixtrain
