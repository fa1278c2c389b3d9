#include "mixtrain/optim/routing.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"
#include "mixtrain/optim/param_groups.h"

namespace mixtrain {
namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

bool contains_any(const std::string& name, const std::vector<std::string>& keywords) {
  for (const auto& keyword : keywords) {
    if (!keyword.empty() && name.find(lower(keyword)) != std::string::npos) return true;
  }
  return false;
}

// hyper-parallel's rule: matrices go to Muon except embeddings and output heads, which are
// lookups/classifiers rather than hidden linear maps.
bool yaml_routes_to_muon(const std::string& name, int64_t ndim, const MuonConfig& muon) {
  if (ndim < 2) return false;
  static const std::vector<std::string> kAdamWNames = {"embed", "lm_head", "out_head",
                                                       "out_proj.bias"};
  return !contains_any(name, kAdamWNames) && !contains_any(name, muon.adamw_keywords);
}

// torchtitan-npu's rule: 2-D weights except embedding/output; 3-D grouped expert weights.
bool toml_routes_to_muon(const std::string& name, int64_t ndim, const MuonConfig& muon) {
  if (contains_any(name, muon.adamw_keywords)) return false;
  if (ndim == 3) return true;
  if (ndim != 2) return false;
  static const std::vector<std::string> kAdamWNames = {"embed", "lm_head", "output"};
  return !contains_any(name, kAdamWNames);
}

std::string format_shape(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

std::string format_number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

std::string optimizer_kind_name(OptimizerKind kind) {
  return kind == OptimizerKind::kMuon ? "muon" : "adamw";
}

std::vector<RouteEntry> route_parameters(
    const std::vector<std::pair<std::string, at::Tensor>>& named_params,
    const OptimizerConfig& config) {
  if (config.target != "AdamW" && config.target != "Muon")
    throw ConfigError("optimizer._target_: unknown optimizer '" + config.target +
                      "' (expected AdamW or Muon)");
  if (config.routing != "yaml" && config.routing != "toml")
    throw ConfigError("optimizer.routing: unknown routing dialect '" + config.routing +
                      "' (expected yaml or toml)");
  const bool muon_target = config.target == "Muon";
  const bool yaml = config.routing == "yaml";

  std::vector<RouteEntry> routes;
  bool any_muon = false;
  for (const auto& [name, param] : named_params) {
    if (!param.requires_grad()) continue;
    RouteEntry entry;
    entry.name = name;
    entry.shape = param.sizes().vec();
    entry.dtype = param.scalar_type();
    const std::string lowered = lower(name);
    const int64_t ndim = param.dim();
    const bool muon = muon_target && (yaml ? yaml_routes_to_muon(lowered, ndim, config.muon)
                                           : toml_routes_to_muon(lowered, ndim, config.muon));
    if (muon) {
      any_muon = true;
      entry.optimizer = OptimizerKind::kMuon;
      entry.lr = config.muon.lr;
      entry.weight_decay = config.muon.weight_decay;
    } else {
      entry.optimizer = OptimizerKind::kAdamW;
      entry.lr = config.adamw.lr;
      entry.weight_decay = yaml && is_no_decay_parameter(name) ? 0.0 : config.adamw.weight_decay;
    }
    routes.push_back(std::move(entry));
  }
  if (muon_target && !any_muon) {
    throw ConfigError(
        "optimizer._target_: Muon, but no trainable parameter is routed to Muon (" +
        std::string(yaml ? "yaml rule: ndim >= 2 and the name contains none of embed, lm_head, "
                           "out_head, out_proj.bias or a muon_adamw_keywords entry"
                         : "toml rule: 2-D not named embed/lm_head/output, or 3-D") +
        "); use AdamW or check the model's parameter names");
  }
  return routes;
}

std::string format_routing_table(const std::vector<RouteEntry>& routes) {
  const std::vector<std::string> header = {"name",      "shape", "dtype",
                                           "optimizer", "lr",    "weight_decay"};
  std::vector<std::vector<std::string>> rows = {header};
  for (const auto& route : routes) {
    rows.push_back({route.name, format_shape(route.shape), dtype_name(route.dtype),
                    optimizer_kind_name(route.optimizer), format_number(route.lr),
                    format_number(route.weight_decay)});
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
