#include "mixtrain/optim/sgd_config.h"

#include "mixtrain/config/startup_log.h"
#include "mixtrain/optim/option_fields.h"

namespace mixtrain {
namespace {

const std::vector<OptionField<SgdOptions>>& sgd_fields() {
  // torch.optim.SGD's refusals.
  static const std::vector<OptionField<SgdOptions>> fields = {
      option<SgdOptions>(
          "lr", [](auto& o) -> auto& { return o.lr(); }, NumberCodec{}, rule_non_negative),
      option<SgdOptions>(
          "momentum", [](auto& o) -> auto& { return o.momentum(); }, NumberCodec{},
          rule_non_negative),
      option<SgdOptions>(
          "dampening", [](auto& o) -> auto& { return o.dampening(); }, NumberCodec{}),
      option<SgdOptions>(
          "weight_decay", [](auto& o) -> auto& { return o.weight_decay(); }, NumberCodec{},
          rule_non_negative),
      option<SgdOptions>(
          "nesterov", [](auto& o) -> auto& { return o.nesterov(); }, FlagCodec{}),
  };
  return fields;
}

}  // namespace

ConfigSectionSpec sgd_config_section() {
  ConfigSectionSpec spec;
  spec.name = "sgd";
  spec.slot = "optimizer";
  spec.target = "SGD";
  spec.in_toml_dialect = false;
  spec.leaves = config_leaves(
      sgd_fields(), "optimizer.sgd_config.sgd_", [](auto& c) -> auto& { return sgd_config(c); });
  spec.check = [](const TrainerConfig& c, const ConfigChecker& check) {
    const SgdOptions& sgd = sgd_config(c);
    if (sgd.nesterov() && (sgd.momentum() <= 0 || sgd.dampening() != 0)) {
      check.fail("optimizer.sgd_config.sgd_nesterov",
                 "requires sgd_momentum > 0 and sgd_dampening 0 (as torch.optim.SGD)");
    }
  };
  spec.translate_toml = [](const TomlInput& given, TrainerConfig& config, Provenance&) {
    if (config.optimizer.target == "SGD") {
      throw_config_error(given.where("optimizer.name"),
                         "\"SGD\" is not available in the TOML dialect (its options have no TOML "
                         "keys); use a YAML config with optimizer._target_: SGD and sgd_config");
    }
  };
  return spec;
}

std::string format_effective_sgd_block(const ResolvedConfig& resolved) {
  if (resolved.config.optimizer.target != "SGD") return "";
  return format_effective_block(resolved, "Effective sgd config:", "optimizer.sgd_config.");
}

}  // namespace mixtrain
