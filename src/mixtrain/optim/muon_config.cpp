#include "mixtrain/optim/muon_config.h"

#include <cmath>
#include <optional>

#include "mixtrain/config/model_sections.h"
#include "mixtrain/config/schema.h"
#include "mixtrain/config/startup_log.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/option_fields.h"

namespace mixtrain {
namespace {

const char kPrefix[] = "optimizer.muon_config.muon_";

// What the trainer does around Muon (the options themselves: muon_option_fields).
const std::vector<OptionField<MuonConfig>>& muon_extra_fields() {
  static const std::vector<OptionField<MuonConfig>> fields = {
      option<MuonConfig>(
          "per_head", [](auto& m) -> auto& { return m.per_head; }, FlagCodec{})
          .toml("optimizer.muon_per_head")
          .not_hyperparameter(),
      option<MuonConfig>(
          "telemetry", [](auto& m) -> auto& { return m.telemetry; }, FlagCodec{})
          .with_key("optimizer.muon_telemetry")
          .toml("optimizer.muon_telemetry")
          .not_hyperparameter(),
      option<MuonConfig>(
          "qk_clip_tau", [](auto& m) -> auto& { return m.qk_clip_tau; }, NumberCodec{},
          [](double v) -> std::string {
            if (v >= 0 && std::isfinite(v)) return "";
            return "must be a finite number >= 0 (0: QK-clip off), got " + format_number(v);
          })
          .toml("optimizer.muon_qk_clip_tau")
          .not_hyperparameter(),
      option<MuonConfig>(
          "adamw_keywords", [](auto& m) -> auto& { return m.adamw_keywords; }, StringListCodec{},
          [](const std::vector<std::string>& v) -> std::string {
            for (const std::string& name : v) {
              if (name.empty()) return "must not contain empty names";
            }
            return "";
          })
          .not_hyperparameter(),
  };
  return fields;
}

// Rules across Muon's keys and the rest of the config.
void check_muon(const TrainerConfig& c, const ConfigChecker& check) {
  const MuonOptions& m = muon_config(c).options;
  const std::string coefficients = std::string(kPrefix) + "ns_coefficients";
  const std::string steps = std::string(kPrefix) + "ns_steps";
  if (m.ns_variant() == "custom") {
    if (m.ns_coefficients().empty()) {
      check.fail(coefficients, "is required when muon_ns_variant is custom");
    }
    if (static_cast<int64_t>(m.ns_coefficients().size()) != m.ns_steps()) {
      check.fail(coefficients, "has " + std::to_string(m.ns_coefficients().size()) +
                                   " [a, b, c] triples but muon_ns_steps is " +
                                   std::to_string(m.ns_steps()) + "; give one triple per step");
    }
  } else if (!m.ns_coefficients().empty()) {
    check.fail(coefficients,
               "is only used with muon_ns_variant: custom (variant is '" + m.ns_variant() + "')");
  }
  // asym5 (quintic) is a fixed five-step schedule; running it longer would silently cut or
  // repeat it.
  if ((m.ns_variant() == "asym5" || m.ns_variant() == "quintic") && m.ns_steps() > 5) {
    check.fail_value(
        steps, "must be <= 5 with muon_ns_variant " + m.ns_variant() + " (a five-step schedule)");
  }
  // Polar Express: two published sets, each designed for its own step count (a prefix of one
  // is not the other), so any other count is refused rather than cut or repeated.
  if (m.ns_variant() == "polar_express" && m.ns_steps() != 5 && m.ns_steps() != 8) {
    check.fail_value(steps,
                     "must be 5 or 8 with muon_ns_variant polar_express (its published 5-step "
                     "and 8-step sets)");
  }
  // Asked-for telemetry that cannot exist would be the silent failure it is meant to catch.
  if (muon_config(c).telemetry && c.optimizer.target != "Muon") {
    check.fail("optimizer.muon_telemetry",
               "needs optimizer._target_ Muon (it watches Muon's Newton-Schulz; the "
               "target is " +
                   c.optimizer.target + ")");
  }
  // QK-clip rescales the q/k projections; with per-head q/k RMSNorm the logits do not depend
  // on that scale, so the clip could never bound them.
  const ModelSection* model = find_model_section(c.model.name);
  if (muon_config(c).qk_clip_tau > 0 && model != nullptr && model->qk_norm) {
    check.fail_value(std::string(kPrefix) + "qk_clip_tau",
                     "must be 0 with model.name " + c.model.name +
                         ": its per-head q/k RMSNorm makes the attention logits independent of "
                         "the q/k projections' scale, which QK-clip rescales");
  }
}

std::vector<std::string> muon_warnings(const TrainerConfig& config) {
  std::vector<std::string> warnings;
  const MuonOptions& muon = muon_config(config).options;
  if (config.optimizer.target == "Muon" && muon.ns_variant() == "hybrid" &&
      muon.ns_steps() <= kHybridLegacySteps) {
    const bool toml = config.dialect == "toml";
    const std::string steps = std::to_string(muon.ns_steps());
    const std::string keys =
        toml ? "optimizer.muon_hybrid_ns = true with optimizer.muon_ns_steps = " + steps
             : "optimizer.muon_config.muon_ns_variant: hybrid with "
               "optimizer.muon_config.muon_ns_steps: " +
                   steps;
    warnings.push_back(
        keys +
        " runs plain legacy Newton-Schulz: hybrid uses the legacy coefficients (3.4445, "
        "-4.7750, 2.0315) for its first " +
        std::to_string(kHybridLegacySteps) +
        " steps and (2.0, -1.5, 0.5) only after them, so all " + steps +
        " steps are legacy; set muon_ns_steps > " + std::to_string(kHybridLegacySteps) +
        " for the hybrid tail");
  }
  if (config.optimizer.target != "Muon" && muon_config(config).per_head) {
    warnings.push_back("optimizer.muon_config.muon_per_head has no effect: optimizer._target_ is " +
                       config.optimizer.target + ", not Muon");
  }
  return warnings;
}

// What runs, where a value names it only indirectly (docs/architecture.md §5).
std::vector<std::string> muon_notes(const TrainerConfig& config) {
  std::vector<std::string> notes;
  const MuonOptions& muon = muon_config(config).options;
  const std::string key = std::string(kPrefix) + "ns_variant";
  if (muon.ns_variant() == "quintic") {
    notes.push_back("note: " + key + " quintic runs asym5's five (a, b, c) triples");
  } else if (muon.ns_variant() == "polar_express" && muon.ns_steps() == 8) {
    notes.push_back("note: " + key +
                    " polar_express with 8 steps runs the paper's Algorithm 1 triples (safety "
                    "1.01) on X / (||X||_F * 1.01 + eps)");
  } else if (muon.ns_variant() == "polar_express" && muon.ns_steps() == 5) {
    notes.push_back("note: " + key +
                    " polar_express with 5 steps runs the published five-step triples (safety "
                    "1.02) on X / (||X||_F * 1.02 + eps)");
  }
  // muon_per_head names no matrices itself: which ones it splits, and how.
  if (config.optimizer.target == "Muon" && muon_config(config).per_head) {
    const std::string d = std::to_string(config.model.head_dim);
    notes.push_back("note: optimizer.muon_config.muon_per_head runs Newton-Schulz on blocks of " +
                    d + " rows of *self_attn.{q,k,v}_proj.weight and of " + d +
                    " columns of *self_attn.o_proj.weight (model.head_dim), each scaled by its "
                    "block's shape");
  }
  return notes;
}

// torchtitan-npu's Muon (muon_config.h).
void translate_muon_toml(const TomlInput& given, TrainerConfig& config, Provenance& provenance) {
  const torch::optim::AdamWOptions& adamw = adamw_config(config);
  MuonOptions& muon = muon_config(config).options;
  const std::string p = kPrefix;
  muon.ns_epsilon(adamw.eps());
  record_derived(provenance, p + "ns_epsilon", "optimizer.eps");
  muon.weight_decay(adamw.weight_decay());
  record_derived(provenance, p + "weight_decay", "optimizer.weight_decay");
  muon.momentum_style(MomentumStyle::kEmaAdd);
  record_derived(provenance, p + "momentum_style", "torchtitan-npu Muon momentum");
  muon.matched_adamw_rms(0.18);
  record_derived(provenance, p + "matched_adamw_rms", "torchtitan-npu constant");

  // muon_ns_variant (a mixtrain key) names any schedule; torchtitan-npu's muon_hybrid_ns only
  // chooses between hybrid and legacy, so giving both is ambiguous and refused.
  const DocValue* variant = given.find("optimizer.muon_ns_variant");
  const DocValue* hybrid_flag = given.find("optimizer.muon_hybrid_ns");
  if (variant != nullptr && hybrid_flag != nullptr) {
    throw_config_error(given.where("optimizer.muon_ns_variant"),
                       "set either optimizer.muon_ns_variant or optimizer.muon_hybrid_ns, not both "
                       "(muon_hybrid_ns = true is muon_ns_variant = \"hybrid\")");
  }
  if (variant != nullptr) {
    muon.ns_variant(read_string(*variant, given.where("optimizer.muon_ns_variant")));
    record_toml(provenance, p + "ns_variant", given.source("optimizer.muon_ns_variant"),
                "optimizer.muon_ns_variant");
  } else {
    bool hybrid = false;
    if (hybrid_flag != nullptr) {
      hybrid = read_bool(*hybrid_flag, given.where("optimizer.muon_hybrid_ns"));
    }
    muon.ns_variant(hybrid ? "hybrid" : "legacy");
    record_derived(provenance, p + "ns_variant",
                   std::string("optimizer.muon_hybrid_ns = ") + (hybrid ? "true" : "false"));
  }

  std::optional<double> muon_lr;
  if (const DocValue* v = given.find("optimizer.muon_lr")) {
    muon_lr = read_float(*v, given.where("optimizer.muon_lr"));
  }
  const std::string lr_key = p + "lr";
  if (muon.adjust_lr_fn() == AdjustLrFn::kOriginal) {
    if (muon_lr) {
      muon.lr(*muon_lr);
      record_toml(provenance, lr_key, given.source("optimizer.muon_lr"), "optimizer.muon_lr");
    } else {
      muon.lr(adamw.lr());
      record_derived(provenance, lr_key,
                     "optimizer.lr (muon_lr not set, muon_adjust_lr_fn = original)");
    }
  } else {
    muon.lr(adamw.lr());
    const std::string mode = adjust_lr_fn_name(muon.adjust_lr_fn());
    std::string note = "optimizer.lr (muon_adjust_lr_fn = " + mode + ")";
    if (muon_lr) {
      note += "; optimizer.muon_lr = " + format_number(*muon_lr) + " ignored";
      log_warn(given.where("optimizer.muon_lr").origin + ": optimizer.muon_lr = " +
               format_number(*muon_lr) + " is ignored: muon_adjust_lr_fn = \"" + mode +
               "\" makes Muon use optimizer.lr = " + format_number(adamw.lr()) +
               " (set muon_adjust_lr_fn = \"original\" to use muon_lr)");
    }
    record_derived(provenance, lr_key, note);
  }
}

}  // namespace

ConfigSectionSpec muon_config_section() {
  ConfigSectionSpec spec;
  spec.name = "muon";
  spec.slot = "optimizer";
  spec.target = "Muon";
  spec.leaves = config_leaves(
      muon_option_fields(), kPrefix, [](auto& c) -> auto& { return muon_config(c).options; });
  for (LeafSpec& leaf : config_leaves(
           muon_extra_fields(), kPrefix, [](auto& c) -> auto& { return muon_config(c); }))
    spec.leaves.push_back(std::move(leaf));
  spec.check = check_muon;
  spec.warnings = muon_warnings;
  spec.notes = muon_notes;
  spec.toml_keys = {"optimizer.muon_lr", "optimizer.muon_hybrid_ns", "optimizer.muon_ns_variant"};
  spec.translate_toml = translate_muon_toml;
  return spec;
}

std::string format_effective_muon_block(const ResolvedConfig& resolved) {
  if (resolved.config.optimizer.target != "Muon") {
    const double tau = muon_config(resolved.config).qk_clip_tau;
    // QK-clip acts on the weights after any optimizer's step (qk_clip.h).
    return "Effective muon config: not used (optimizer._target_ is " +
           resolved.config.optimizer.target + ")" +
           (tau > 0 ? "; muon_qk_clip_tau " + format_number(tau) +
                          " applies all the same: QK-clip runs after every step"
                    : std::string()) +
           "\n";
  }
  return format_effective_block(resolved, "Effective muon config:", "optimizer.muon_config.",
                                {"optimizer.muon_telemetry"});
}

}  // namespace mixtrain
