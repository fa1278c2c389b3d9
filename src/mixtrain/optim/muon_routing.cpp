#include "mixtrain/optim/muon_routing.h"

#include <string>
#include <vector>

#include "mixtrain/core/text.h"
#include "mixtrain/optim/muon_config.h"

namespace mixtrain {
namespace {

bool contains_any(const std::string& name, const std::vector<std::string>& keywords) {
  for (const auto& keyword : keywords) {
    if (!keyword.empty() && name.find(to_lower(keyword)) != std::string::npos) return true;
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

std::string route_muon(const std::string& lowered_name, int64_t ndim,
                       const OptimizerConfig& config) {
  const MuonConfig& muon_section = config.options.get<MuonConfig>();
  const bool muon = config.routing == "yaml"
                        ? yaml_routes_to_muon(lowered_name, ndim, muon_section)
                        : toml_routes_to_muon(lowered_name, ndim, muon_section);
  return muon ? "muon" : "adamw";
}

std::string none_routed_to_muon(const OptimizerConfig& config) {
  return "Muon, but no trainable parameter is routed to Muon (" +
         std::string(config.routing == "yaml"
                         ? "yaml rule: ndim >= 2 and the name contains none of embed, lm_head, "
                           "out_head, out_proj.bias or a muon_adamw_keywords entry"
                         : "toml rule: 2-D not named embed/lm_head/output, or 3-D") +
         "); use AdamW or check the model's parameter names";
}

}  // namespace

const RoutingRule kMuonRoutingRule = {route_muon, none_routed_to_muon};

}  // namespace mixtrain
