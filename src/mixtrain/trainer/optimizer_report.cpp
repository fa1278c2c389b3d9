#include "mixtrain/trainer/optimizer_report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include "mixtrain/config/dialect_defaults.h"
#include "mixtrain/config/schema.h"
#include "mixtrain/config/toml_front_end.h"
#include "mixtrain/core/text_table.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/mixed_precision_optimizer.h"
#include "mixtrain/optim/optimizer_table.h"
#include "mixtrain/optim/param_groups.h"
#include "mixtrain/optim/training_optimizer.h"

namespace mixtrain {
namespace {

// A group field as the config displays values (schema.h): shortest round-trip numbers,
// "[a, b]" lists, true/false, strings as they are.
std::string display_json(const nlohmann::json& value) {
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_number_integer()) return std::to_string(value.get<int64_t>());
  if (value.is_number()) return format_number(value.get<double>());
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    return text.empty() ? "\"\"" : text;
  }
  if (value.is_array()) {
    std::string text = "[";
    for (size_t i = 0; i < value.size(); ++i) text += (i > 0 ? ", " : "") + display_json(value[i]);
    return text + "]";
  }
  return value.dump();
}

// "optimizer.adamw_config.adamw_eps" for ("adamw", "eps"): the leaf group fields carry the
// config's names without the prefix.
std::string canonical_key(const std::string& optimizer, const std::string& field) {
  return optimizer_named(optimizer).config_section + "." + optimizer + "_" + field;
}

// The key a user of the config's dialect sets this value with. TOML derives some values:
// "from <what>" where no key of its own sets it, "<key>; now from <other key ...>" where this
// run took it from another key (the Muon lr in match_rms_adamw mode).
std::string dialect_key(const ResolvedConfig& resolved, const std::string& key) {
  if (resolved.config.dialect != "toml") return key;
  const ResolvedLeaf* leaf = resolved.leaf(key);
  const std::string derived_from =
      leaf != nullptr && leaf->source == ValueSource::kDerived ? leaf->origin : "";
  std::string toml = toml_key_for(key);
  if (toml == "optimizer.beta1") toml = "optimizer.beta1, optimizer.beta2";
  if (toml.empty()) return derived_from.empty() ? "-" : "from " + derived_from;
  if (derived_from.rfind("optimizer.", 0) == 0) return toml + "; now from " + derived_from;
  return toml;
}

// Rows in the config's order (lr first, then the canonical leaves), then fields no config
// key sets, by name.
std::vector<std::string> field_order(const std::string& optimizer, const nlohmann::json& group) {
  std::vector<std::string> order = {"lr"};
  for (const LeafSpec& spec : canonical_leaves()) {
    const std::string prefix = canonical_key(optimizer, "");
    if (spec.key.rfind(prefix, 0) != 0) continue;
    const std::string field = spec.key.substr(prefix.size());
    if (field != "lr" && group.contains(field)) order.push_back(field);
  }
  for (const auto& item : group.items()) {
    if (std::find(order.begin(), order.end(), item.key()) == order.end()) {
      order.push_back(item.key());
    }
  }
  return order;
}

// The param-group fields that are not hyper-parameters (ChainedOptimizer::param_groups_state).
bool is_group_bookkeeping(const std::string& field) {
  return field == "optimizer" || field == "group" || field == "params" || field == "base_lr";
}

OptimizerReportTable make_table(const std::string& optimizer,
                                const std::vector<const nlohmann::json*>& groups,
                                const ChainedOptimizer& chained, const ResolvedConfig& resolved,
                                const TrainerConfig& defaults) {
  OptimizerReportTable table;
  table.optimizer = optimizer;
  OptimizerReportRow params{"params", "", "", {}};
  OptimizerReportRow elements{"elements", "", "", {}};
  nlohmann::json hyper = nlohmann::json::object();  // every hyper-parameter field of the groups
  // The YAML rule gives no-decay names (param_groups.h) weight decay 0, in a group of their own.
  const bool no_decay_rule =
      optimizer_named(optimizer).yaml_no_decay && resolved.config.optimizer.routing == "yaml";
  for (const nlohmann::json* group : groups) {
    int64_t numel = 0;
    bool all_no_decay = !group->at("params").empty();
    for (const auto& name : group->at("params")) {
      numel += chained.optimizer_param(name.get<std::string>()).numel();
      all_no_decay = all_no_decay && is_no_decay_parameter(name.get<std::string>());
    }
    params.values.push_back(std::to_string(group->at("params").size()));
    elements.values.push_back(std::to_string(numel));
    table.groups.push_back("group " + std::to_string(group->at("group").get<size_t>()) +
                           (no_decay_rule && all_no_decay ? " (no decay)" : ""));
    for (const auto& item : group->items()) {
      if (!is_group_bookkeeping(item.key())) hyper[item.key()] = item.value();
    }
  }
  table.rows.push_back(std::move(params));
  table.rows.push_back(std::move(elements));

  for (const std::string& field : field_order(optimizer, hyper)) {
    OptimizerReportRow row{field, "-", "-", {}};
    const std::string key = canonical_key(optimizer, field);
    if (const LeafSpec* spec = find_canonical_leaf(key)) {
      row.key = dialect_key(resolved, key);
      row.default_value = spec->format(defaults);
      if (no_decay_rule && field == "weight_decay") {
        row.default_value += " (no-decay names: 0)";
      }
    }
    for (const nlohmann::json* group : groups) {
      const char* source = field == "lr" ? "base_lr" : field.c_str();
      row.values.push_back(group->contains(source) ? display_json(group->at(source)) : "-");
    }
    table.rows.push_back(std::move(row));
  }
  return table;
}

std::string format_table(const OptimizerReportTable& table, const std::string& dialect) {
  std::vector<std::vector<std::string>> cells;
  std::vector<std::string> header = {table.optimizer, "key (" + dialect + ")",
                                     "constructor default (" + dialect + ")"};
  header.insert(header.end(), table.groups.begin(), table.groups.end());
  cells.push_back(std::move(header));
  for (const OptimizerReportRow& row : table.rows) {
    std::vector<std::string> line = {row.name, row.key, row.default_value};
    line.insert(line.end(), row.values.begin(), row.values.end());
    cells.push_back(std::move(line));
  }
  return format_text_table(cells);
}

std::string format_main_params(const MainParamsSummary& main) {
  if (!main.enabled) {
    return "  fp32 main params: none (optimizer.fp32_main_params false: the optimizer updates the "
           "model params in their own dtype)\n";
  }
  char mib[32];
  std::snprintf(mib, sizeof(mib), "%.2f", static_cast<double>(main.bytes) / (1 << 20));
  std::ostringstream out;
  out << "  fp32 main params: " << main.count << " (of the bfloat16/float16 model params), "
      << main.elements << " elements, " << main.bytes << " bytes (" << mib << " MiB); "
      << main.own_count << " float32 model params are their own main params\n";
  return out.str();
}

}  // namespace

const OptimizerReportRow* OptimizerReportTable::row(const std::string& name) const {
  for (const OptimizerReportRow& candidate : rows) {
    if (candidate.name == name) return &candidate;
  }
  return nullptr;
}

OptimizerReport collect_optimizer_report(TrainingOptimizer& optimizer,
                                         const ResolvedConfig& resolved) {
  OptimizerReport report;
  report.dialect = resolved.config.dialect;
  const TrainerConfig defaults = dialect_default_config(resolved.config.dialect);
  const ChainedOptimizer& chained = optimizer.chained();
  const nlohmann::json groups = chained.param_groups_state();

  std::vector<std::string> kinds;  // leaf order
  for (const auto& group : groups) {
    const std::string kind = group["optimizer"].get<std::string>();
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
  }
  for (const std::string& kind : kinds) {
    std::vector<const nlohmann::json*> of_kind;
    for (const auto& group : groups) {
      if (group["optimizer"] == kind) of_kind.push_back(&group);
    }
    report.tables.push_back(make_table(kind, of_kind, chained, resolved, defaults));
  }

  if (const auto* mixed = dynamic_cast<const MixedPrecisionOptimizer*>(&optimizer)) {
    MainParamsSummary& main = report.main_params;
    main.enabled = true;
    for (const std::string& name : mixed->low_precision_names()) {
      const at::Tensor& param = mixed->main_param(name);
      main.count += 1;
      main.elements += param.numel();
      main.bytes += param.numel() * static_cast<int64_t>(param.element_size());
    }
    main.own_count = static_cast<int64_t>(chained.names().size()) - main.count;
  }
  return report;
}

std::string format_optimizer_report(const OptimizerReport& report, const std::string& when) {
  std::string text = "Optimizer " + when +
                     " (live param groups; elements as this rank holds them; lr before the LR "
                     "schedule's factor):\n";
  for (const OptimizerReportTable& table : report.tables) {
    text += format_table(table, report.dialect);
  }
  return text + format_main_params(report.main_params);
}

std::string optimizer_report_text(TrainingOptimizer& optimizer, const ResolvedConfig& resolved,
                                  const std::string& when) {
  return format_optimizer_report(collect_optimizer_report(optimizer, resolved), when);
}

}  // namespace mixtrain
