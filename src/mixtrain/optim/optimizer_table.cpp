#include "mixtrain/optim/optimizer_table.h"

#include <torch/optim/adamw.h>

#include <stdexcept>
#include <utility>

#include <mutex>

#include "mixtrain/config/section.h"
#include "mixtrain/core/error.h"
#include "mixtrain/optim/adamw.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/muon.h"
#include "mixtrain/optim/muon_config.h"
#include "mixtrain/optim/muon_routing.h"
#include "mixtrain/optim/sgd.h"
#include "mixtrain/optim/sgd_config.h"

namespace mixtrain {
namespace {

// Each group's options are the section's with the group's lr and weight decay.
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> torch_groups(
    const std::vector<LeafParamGroup>& groups, const Options& defaults) {
  std::vector<torch::optim::OptimizerParamGroup> out;
  for (const LeafParamGroup& group : groups) {
    Options options = defaults;
    options.lr(group.lr).weight_decay(group.weight_decay);
    out.emplace_back(group.params, std::make_unique<Options>(options));
  }
  return out;
}

const torch::optim::AdamWOptions& adamw_options(const OptimizerConfig& config) {
  return config.options.get<torch::optim::AdamWOptions>();
}
const MuonOptions& muon_options(const OptimizerConfig& config) {
  return config.options.get<MuonConfig>().options;
}
const SgdOptions& sgd_options(const OptimizerConfig& config) {
  return config.options.get<SgdOptions>();
}

std::unique_ptr<LeafOptimizer> make_adamw(const std::vector<LeafParamGroup>& groups,
                                          const OptimizerConfig& config) {
  const auto& defaults = adamw_options(config);
  return std::make_unique<AdamW>(torch_groups(groups, defaults), defaults);
}

std::unique_ptr<LeafOptimizer> make_muon(const std::vector<LeafParamGroup>& groups,
                                         const OptimizerConfig& config) {
  const MuonOptions& defaults = muon_options(config);
  defaults.validate();
  return std::make_unique<Muon>(torch_groups(groups, defaults), defaults);
}

std::unique_ptr<LeafOptimizer> make_sgd(const std::vector<LeafParamGroup>& groups,
                                        const OptimizerConfig& config) {
  const auto& defaults = sgd_options(config);
  return std::make_unique<Sgd>(torch_groups(groups, defaults), defaults);
}

}  // namespace

const std::vector<OptimizerTableEntry>& optimizer_table() {
  static const std::vector<OptimizerTableEntry> table = {
      {"adamw",
       "AdamW",
       "optimizer.adamw_config",
       {"exp_avg", "exp_avg_sq", "step"},
       [](const OptimizerConfig& c) { return adamw_options(c).lr(); },
       [](const OptimizerConfig& c) { return adamw_options(c).weight_decay(); },
       true,
       make_adamw,
       nullptr,
       [](const OptimizerConfig& c) { return adamw_options(c).lr(); },
       format_effective_adamw_block},
      // As a target, Muon reports AdamW's lr (the lr of the parameters it leaves to AdamW).
      {"muon",
       "Muon",
       "optimizer.muon_config",
       {"momentum_buffer", "step"},
       [](const OptimizerConfig& c) { return muon_options(c).lr(); },
       [](const OptimizerConfig& c) { return muon_options(c).weight_decay(); },
       false,
       make_muon,
       &kMuonRoutingRule,
       [](const OptimizerConfig& c) { return adamw_options(c).lr(); },
       format_effective_muon_block},
      {"sgd",
       "SGD",
       "optimizer.sgd_config",
       {"momentum_buffer", "step"},
       [](const OptimizerConfig& c) { return sgd_options(c).lr(); },
       [](const OptimizerConfig& c) { return sgd_options(c).weight_decay(); },
       true,
       make_sgd,
       nullptr,
       [](const OptimizerConfig& c) { return sgd_options(c).lr(); },
       format_effective_sgd_block},
  };
  return table;
}

void register_optimizer_sections() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Display order of the keys: Muon's, AdamW's, SGD's.
    register_config_section(muon_config_section());
    register_config_section(adamw_config_section());
    register_config_section(sgd_config_section());
  });
}

const OptimizerTableEntry& optimizer_for_target(const std::string& target) {
  std::string targets;
  for (const OptimizerTableEntry& entry : optimizer_table()) {
    if (entry.target == target) return entry;
    targets += (targets.empty() ? "" : ", ") + entry.target;
  }
  throw ConfigError(ConfigKey{"optimizer._target_"},
                    "unknown optimizer '" + target + "' (expected " + targets + ")");
}

const OptimizerTableEntry& optimizer_named(const std::string& name) {
  for (const OptimizerTableEntry& entry : optimizer_table()) {
    if (entry.name == name) return entry;
  }
  throw std::invalid_argument("no optimizer named '" + name + "' in the optimizer table");
}

}  // namespace mixtrain
