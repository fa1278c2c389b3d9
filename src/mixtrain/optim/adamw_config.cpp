#include "mixtrain/optim/adamw_config.h"

#include "mixtrain/config/startup_log.h"
#include "mixtrain/optim/option_fields.h"

namespace mixtrain {
namespace {

using torch::optim::AdamWOptions;

const std::vector<OptionField<AdamWOptions>>& adamw_fields() {
  static const std::vector<OptionField<AdamWOptions>> fields = {
      option<AdamWOptions>(
          "lr", [](auto& o) -> auto& { return o.lr(); }, NumberCodec{}, rule_non_negative)
          .toml("optimizer.lr"),
      option<AdamWOptions>(
          "weight_decay", [](auto& o) -> auto& { return o.weight_decay(); }, NumberCodec{},
          rule_non_negative)
          .toml("optimizer.weight_decay"),
      option<AdamWOptions>(
          "betas", [](auto& o) -> auto& { return o.betas(); }, PairCodec{},
          [](const std::tuple<double, double>& b) -> std::string {
            const std::string first = rule_unit_interval_open_right(std::get<0>(b));
            const std::string second = rule_unit_interval_open_right(std::get<1>(b));
            if (first.empty() && second.empty()) return "";
            return "must be in [0, 1), got " + PairCodec{}.show(b);
          })
          .toml("optimizer.beta1", /*by_section=*/true),
      option<AdamWOptions>(
          "eps", [](auto& o) -> auto& { return o.eps(); }, NumberCodec{}, rule_positive)
          .toml("optimizer.eps"),
  };
  return fields;
}

// torchtitan's betas: beta1 and beta2 are separate keys, each defaulting to (0.9, 0.95)'s.
void translate_adamw_toml(const TomlInput& given, TrainerConfig& config, Provenance& provenance) {
  AdamWOptions& adamw = adamw_config(config);
  const DocValue* beta1 = given.find("optimizer.beta1");
  const DocValue* beta2 = given.find("optimizer.beta2");
  double first = 0.9;
  double second = 0.95;
  if (beta1 != nullptr) first = read_float(*beta1, given.where("optimizer.beta1"));
  if (beta2 != nullptr) second = read_float(*beta2, given.where("optimizer.beta2"));
  adamw.betas({first, second});
  const std::string key = "optimizer.adamw_config.adamw_betas";
  if (beta1 == nullptr && beta2 == nullptr) {
    record_derived(provenance, key, "torchtitan (beta1, beta2) defaults");
  } else {
    record_toml(provenance, key,
                given.source(beta1 != nullptr ? "optimizer.beta1" : "optimizer.beta2"),
                "optimizer.beta1, optimizer.beta2");
  }
}

}  // namespace

ConfigSectionSpec adamw_config_section() {
  ConfigSectionSpec spec;
  spec.name = "adamw";
  spec.slot = "optimizer";
  spec.target = "AdamW";
  spec.default_target = true;
  spec.leaves = config_leaves(
      adamw_fields(), "optimizer.adamw_config.adamw_",
      [](auto& c) -> auto& { return adamw_config(c); });
  spec.toml_defaults = [](TrainerConfig& config) {
    adamw_config(config).lr(8e-4).weight_decay(0.1);
  };
  spec.toml_keys = {"optimizer.beta1", "optimizer.beta2"};
  spec.translate_toml = translate_adamw_toml;
  return spec;
}

std::string format_effective_adamw_block(const ResolvedConfig& resolved) {
  return format_effective_block(resolved, "Effective adamw config:", "optimizer.adamw_config.");
}

}  // namespace mixtrain
