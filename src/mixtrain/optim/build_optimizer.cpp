#include "mixtrain/optim/build_optimizer.h"

#include <torch/optim/adamw.h>

#include <stdexcept>
#include <unordered_map>

#include "mixtrain/config/validate.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/optim/adamw.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/mixed_precision_optimizer.h"
#include "mixtrain/optim/muon.h"
#include "mixtrain/optim/routing.h"

namespace mixtrain {
namespace {

// Parameters of one leaf, split into groups by distinct (lr, weight_decay), first-seen order.
struct LeafGroups {
  std::vector<std::pair<double, double>> keys;  // (lr, weight_decay)
  std::vector<std::vector<at::Tensor>> params;
  NamedTensors named;
};

void add_to_groups(LeafGroups& groups, const RouteEntry& route, const at::Tensor& param) {
  const std::pair<double, double> key{route.lr, route.weight_decay};
  size_t index = 0;
  while (index < groups.keys.size() && groups.keys[index] != key) ++index;
  if (index == groups.keys.size()) {
    groups.keys.push_back(key);
    groups.params.emplace_back();
  }
  groups.params[index].push_back(param);
  groups.named.emplace_back(route.name, param);
}

std::unique_ptr<LeafOptimizer> make_adamw(const LeafGroups& groups, const AdamWConfig& config) {
  auto options = [&](double lr, double weight_decay) {
    return torch::optim::AdamWOptions(lr)
        .betas({config.betas[0], config.betas[1]})
        .eps(config.eps)
        .weight_decay(weight_decay)
        .amsgrad(false);
  };
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  for (size_t i = 0; i < groups.keys.size(); ++i) {
    param_groups.emplace_back(groups.params[i],
                              std::make_unique<torch::optim::AdamWOptions>(
                                  options(groups.keys[i].first, groups.keys[i].second)));
  }
  return std::make_unique<AdamW>(std::move(param_groups), options(config.lr, config.weight_decay));
}

std::unique_ptr<LeafOptimizer> make_muon(const LeafGroups& groups, const MuonConfig& config) {
  const MuonOptions defaults = MuonOptions::from_config(config);
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  for (size_t i = 0; i < groups.keys.size(); ++i) {
    MuonOptions options = defaults;
    options.lr(groups.keys[i].first).weight_decay(groups.keys[i].second);
    param_groups.emplace_back(groups.params[i], std::make_unique<MuonOptions>(options));
  }
  return std::make_unique<Muon>(std::move(param_groups), defaults);
}

}  // namespace

std::unique_ptr<TrainingOptimizer> build_optimizer(
    const std::vector<std::pair<std::string, at::Tensor>>& named_params,
    const TrainerConfig& config) {
  const OptimizerConfig& optimizer = config.optimizer;
  require_fp32_reduce_for_main_params(optimizer.fp32_main_params, config.mix_precision,
                                      "build_optimizer");
  std::vector<RouteEntry> routes = route_parameters(named_params, optimizer);
  if (routes.empty())
    throw std::invalid_argument("build_optimizer: the model has no trainable parameters");

  std::unordered_map<std::string, at::Tensor> by_name;
  for (const auto& [name, param] : named_params) {
    if (!by_name.emplace(name, param).second)
      throw std::invalid_argument("build_optimizer: two parameters are named '" + name + "'");
  }
  LeafGroups adamw_groups, muon_groups;
  for (const auto& route : routes) {
    if (route.dtype == at::kHalf && !optimizer.fp32_main_params)
      throw ConfigError("optimizer.fp32_main_params: parameter '" + route.name +
                        "' is float16, which needs fp32 main params and loss scaling; set "
                        "optimizer.fp32_main_params: true (or use bfloat16/float32)");
    add_to_groups(route.optimizer == OptimizerKind::kMuon ? muon_groups : adamw_groups, route,
                  by_name.at(route.name));
  }

  auto chained = std::make_unique<ChainedOptimizer>();
  try {
    if (!adamw_groups.named.empty())
      chained->add_leaf(make_adamw(adamw_groups, optimizer.adamw), adamw_groups.named);
    if (!muon_groups.named.empty())
      chained->add_leaf(make_muon(muon_groups, optimizer.muon), muon_groups.named);
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
