#include "mixtrain/optim/build_optimizer.h"

#include <map>
#include <stdexcept>
#include <unordered_map>

#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/mixed_precision_optimizer.h"
#include "mixtrain/optim/muon.h"
#include "mixtrain/optim/muon_config.h"
#include "mixtrain/optim/optimizer_table.h"
#include "mixtrain/optim/routing.h"

namespace mixtrain {
namespace {

// Parameters of one leaf, split into groups by distinct (lr, weight_decay), first-seen order.
struct LeafGroups {
  std::vector<LeafParamGroup> groups;
  NamedTensors named;
};

void add_to_groups(LeafGroups& leaf, const RouteEntry& route, const at::Tensor& param) {
  size_t index = 0;
  while (index < leaf.groups.size() && (leaf.groups[index].lr != route.lr ||
                                        leaf.groups[index].weight_decay != route.weight_decay))
    ++index;
  if (index == leaf.groups.size()) leaf.groups.push_back({route.lr, route.weight_decay, {}});
  leaf.groups[index].params.push_back(param);
  leaf.named.emplace_back(route.name, param);
}

// muon_per_head: the q/k/v/o weights of every attention layer (by the model's roles)
// orthogonalized per head of head_dim.
void split_attention_heads(Muon& muon, const NamedTensors& named, const ParamRoles& roles,
                           int64_t head_dim) {
  if (roles.empty()) {
    throw ConfigError(ConfigKey{"optimizer.muon_config.muon_per_head"},
                      "needs the model's parameter roles (which matrices are attention "
                      "projections); none were given");
  }
  int64_t split = 0;
  for (const auto& [name, param] : named) {
    const auto role = roles.find(name);
    if (role == roles.end() || param.dim() != 2) continue;
    const int64_t block = head_layout_or_standard(role->second.heads, head_dim).block;
    if (const auto heads = attention_head_split(role->second.role, block)) {
      muon.set_head_split(param, *heads);
      ++split;
    }
  }
  log_info("Muon per head: " + std::to_string(split) +
           " attention matrices (the q/k/v/o projection weights) orthogonalized per head of " +
           std::to_string(head_dim) + " (or the projection's own head block)" +
           (split == 0 ? " (none found: every matrix stays whole)" : ""));
}

}  // namespace

std::unique_ptr<TrainingOptimizer> build_optimizer(
    const std::vector<std::pair<std::string, at::Tensor>>& named_params,
    const TrainerConfig& config, const ParamRoles& roles) {
  const OptimizerConfig& optimizer = config.optimizer;
  std::vector<RouteEntry> routes = route_parameters(named_params, optimizer);
  if (routes.empty())
    throw std::invalid_argument("build_optimizer: the model has no trainable parameters");

  std::unordered_map<std::string, at::Tensor> by_name;
  for (const auto& [name, param] : named_params) {
    if (!by_name.emplace(name, param).second)
      throw std::invalid_argument("build_optimizer: two parameters are named '" + name + "'");
  }
  std::map<std::string, LeafGroups> leaves;  // by table entry name
  for (const auto& route : routes) {
    if (route.dtype == at::kHalf && !optimizer.fp32_main_params)
      throw ConfigError(ConfigKey{"optimizer.fp32_main_params"},
                        "parameter '" + route.name +
                            "' is float16, which needs fp32 main params and loss scaling; set it "
                            "to true (or use bfloat16/float32)");
    add_to_groups(leaves[route.optimizer], route, by_name.at(route.name));
  }

  auto chained = std::make_unique<ChainedOptimizer>();
  try {
    for (const OptimizerTableEntry& entry : optimizer_table()) {
      auto leaf = leaves.find(entry.name);
      if (leaf == leaves.end()) continue;
      std::unique_ptr<LeafOptimizer> made = entry.make(leaf->second.groups, optimizer);
      if (auto* muon = dynamic_cast<Muon*>(made.get()); muon && muon_config(config).per_head)
        split_attention_heads(*muon, leaf->second.named, roles, config.model.head_dim);
      chained->add_leaf(std::move(made), leaf->second.named);
    }
  } catch (const std::invalid_argument& error) {
    // An option the leaf refuses is a config problem; name the section it came from.
    throw ConfigError(std::string("optimizer: ") + error.what());
  }
  chained->set_routing(routes);
  log_info("Optimizer routing (" + optimizer.target + ", " + optimizer.routing + " rule" +
           (optimizer.fp32_main_params ? ", fp32 main params" : "") + "):\n" +
           format_routing_table(routes));

  if (!optimizer.fp32_main_params) return chained;
  return std::make_unique<MixedPrecisionOptimizer>(std::move(chained));
}

}  // namespace mixtrain
