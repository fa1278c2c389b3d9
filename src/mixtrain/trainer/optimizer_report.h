// What the running optimizer holds (fp32-main-params §10), read from its live objects, never from
// the config: the trainer logs it (rank 0) after building the optimizer and again after a
// checkpoint restore, so a hyper-parameter the checkpoint brought back shows up.
//
// One table per leaf optimizer (in optimizer-table order), one value column per param group, from
// ChainedOptimizer::param_groups_state() (what checkpoints save and restore) and the groups'
// tensors:
//   params, elements   how many parameters routing put in the group, and their elements as
//                      this rank holds them (FSDP / expert-parallel shards are rank 0's share)
//   lr                 the group's base lr: what the LR schedule multiplies each step
//   the rest           every other hyper-parameter of the group (LeafOptimizer::
//                      group_hyperparameters): betas, eps, weight_decay, amsgrad; Muon's
//                      momentum, nesterov, ns_* settings, ...
// Each hyper-parameter row also has its key in the config's dialect ("from <what>" for a
// value the TOML dialect derives, "-" for one no key sets) and the constructor default of that
// dialect (dialect_defaults.h). Under the YAML routing rule, a group of a leaf that follows the
// no-decay rule (adamw, sgd) all of whose parameter names are no-decay names (param_groups.h)
// is labelled "(no decay)". Then one line
// on the fp32 main params.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/config/load.h"

namespace mixtrain {

class TrainingOptimizer;

struct OptimizerReportRow {
  std::string name;                 // "params", "elements", "lr", "betas", ...
  std::string key;                  // in the config's dialect; empty for params / elements
  std::string default_value;        // constructor default; empty for params / elements
  std::vector<std::string> values;  // one per group
};

struct OptimizerReportTable {
  std::string optimizer;            // an optimizer-table name: "adamw", "muon", "sgd"
  std::vector<std::string> groups;  // "group 0", "group 1 (no decay)"
  std::vector<OptimizerReportRow> rows;
  const OptimizerReportRow* row(const std::string& name) const;  // nullptr if none
};

struct MainParamsSummary {
  bool enabled = false;   // optimizer.fp32_main_params
  int64_t count = 0;      // separate fp32 main params (of bfloat16 / float16 model params)
  int64_t elements = 0;   // their elements on this rank
  int64_t bytes = 0;      // their bytes on this rank
  int64_t own_count = 0;  // float32 model params, their own main params (no copy)
};

struct OptimizerReport {
  std::string dialect;  // of the config: names the key and default columns
  std::vector<OptimizerReportTable> tables;
  MainParamsSummary main_params;
};

OptimizerReport collect_optimizer_report(TrainingOptimizer& optimizer,
                                         const ResolvedConfig& resolved);

// "Optimizer <when> (rank 0, live param groups):" then the tables as aligned columns and the
// main-params line; `when` is e.g. "after construction".
std::string format_optimizer_report(const OptimizerReport& report, const std::string& when);
// Both in one: what the trainer logs.
std::string optimizer_report_text(TrainingOptimizer& optimizer, const ResolvedConfig& resolved,
                                  const std::string& when);

}  // namespace mixtrain
