// The optimizer table: every leaf optimizer the trainer can build, one entry each. Routing,
// building, the optimizer report and the start-up log read it; nothing else names an
// optimizer. Adding one is a new leaf (a LeafOptimizer subclass), its config section (its
// options as one field list, option_fields.h; muon_config.h is the model), one entry here and
// one line in register_optimizer_sections (docs/extending.md "Adding an optimizer").
//
// optimizer._target_ picks the entry whose `target` it equals. That entry's `rule` says which
// entry updates each trainable parameter: none (AdamW, SGD) sends every one to the target;
// Muon's sends matrices to Muon and the rest to AdamW (muon_routing.h). Each parameter then
// gets the lr and weight decay of the entry that updates it, the weight decay 0 under the YAML
// no-decay rule (param_groups.h) where the entry follows it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/config/load.h"
#include "mixtrain/config/trainer_config.h"
#include "mixtrain/optim/leaf_optimizer.h"

namespace mixtrain {

// One param group of a leaf: parameters sharing (lr, weight_decay), in model order.
struct LeafParamGroup {
  double lr;
  double weight_decay;
  std::vector<at::Tensor> params;
};

// For a target that splits the parameters: the entry name for a parameter (lower-cased name,
// ndim) under the config's routing dialect, and the problem (without a key name) when it routes
// none to the target itself; route_parameters throws it on optimizer._target_.
struct RoutingRule {
  std::string (*route)(const std::string& lowered_name, int64_t ndim,
                       const OptimizerConfig& config);
  std::string (*none_routed)(const OptimizerConfig& config);
};

struct OptimizerTableEntry {
  std::string name;            // LeafOptimizer::kind(): routing table, group labels, logs
  std::string target;          // the optimizer._target_ value that selects it
  std::string config_section;  // its canonical config section, "optimizer.adamw_config"
  // The names export_state gives (and import_state takes) per parameter, which become the
  // checkpoint keys optimizer.state.<fqn>.<field>.
  std::vector<std::string> state_fields;
  double (*lr)(const OptimizerConfig& config);
  double (*weight_decay)(const OptimizerConfig& config);
  bool yaml_no_decay;  // under the YAML dialect, no-decay names get weight decay 0
  // Its leaf over the groups (non-empty); invalid options throw std::invalid_argument.
  std::unique_ptr<LeafOptimizer> (*make)(const std::vector<LeafParamGroup>& groups,
                                         const OptimizerConfig& config);
  const RoutingRule* rule;  // null: every trainable parameter goes to this entry
  // As a target: the base lr the step log reports (times the LR schedule factor).
  double (*reported_lr)(const OptimizerConfig& config);
  // Its "Effective <name> config" block of the start-up log ("" for none).
  std::string (*startup_block)(const ResolvedConfig& resolved);
};

// Registers every optimizer's config section (config/section.h), once; a binary calls it
// before it reads a config.
void register_optimizer_sections();

// Every entry, in build order (leaves are chained in this order).
const std::vector<OptimizerTableEntry>& optimizer_table();

// The entry selected by optimizer._target_; else ConfigError on ConfigKey optimizer._target_
// listing the table's targets (the table is the one list; config/ cannot see it).
const OptimizerTableEntry& optimizer_for_target(const std::string& target);
// The entry of a leaf name ("adamw"); std::invalid_argument for an unknown one.
const OptimizerTableEntry& optimizer_named(const std::string& name);

}  // namespace mixtrain
