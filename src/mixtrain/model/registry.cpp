#include "mixtrain/model/registry.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/section.h"
#include "mixtrain/core/error.h"
#include "mixtrain/model/deepseek_v3.h"
#include "mixtrain/model/deepseek_v3_config.h"
#include "mixtrain/model/hf_config.h"
#include "mixtrain/model/mistral.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/qwen2.h"
#include "mixtrain/model/qwen2_moe.h"
#include "mixtrain/model/qwen3.h"
#include "mixtrain/model/sliding_window_config.h"

namespace mixtrain {
namespace {

// model.rope_scaling and the keys that parameterise it, which mean nothing without it
// (rotary_inv_freq, layers.h): llama3's four, YaRN's factor, original length and its own four.
void check_rope_scaling(const TrainerConfig& c, const ConfigChecker& check) {
  const ModelConfig& m = c.model;
  if (m.rope_scaling != "none" && m.rope_scaling != "llama3" && m.rope_scaling != "yarn") {
    check.fail("model.rope_scaling",
               "must be one of none, llama3, yarn, got '" + m.rope_scaling + "'");
  }
  const std::vector<std::pair<const char*, std::vector<std::string>>> params = {
      {"model.rope_scaling_factor", {"llama3", "yarn"}},
      {"model.rope_original_max_seq_len", {"llama3", "yarn"}},
      {"model.rope_low_freq_factor", {"llama3"}},
      {"model.rope_high_freq_factor", {"llama3"}},
      {"model.rope_yarn_beta_fast", {"yarn"}},
      {"model.rope_yarn_beta_slow", {"yarn"}},
      {"model.rope_yarn_mscale", {"yarn"}},
      {"model.rope_yarn_mscale_all_dim", {"yarn"}}};
  for (const auto& [key, schemes] : params) {
    if (!check.was_set(key) ||
        std::find(schemes.begin(), schemes.end(), m.rope_scaling) != schemes.end()) {
      continue;
    }
    std::string names;
    for (const std::string& s : schemes) names += (names.empty() ? "" : " or ") + s;
    check.fail(key, "applies only with " + check.key("model.rope_scaling") + ": " + names +
                        " (it is " + m.rope_scaling + "); remove it or set the scaling");
  }
  if (m.rope_scaling == "none") return;
  check.positive("model.rope_scaling_factor", m.rope_scaling_factor);
  check.positive("model.rope_original_max_seq_len",
                 static_cast<double>(m.rope_original_max_seq_len));
  if (m.rope_scaling == "yarn") {
    check.positive("model.rope_yarn_beta_fast", m.rope_yarn_beta_fast);
    check.positive("model.rope_yarn_beta_slow", m.rope_yarn_beta_slow);
    check.non_negative("model.rope_yarn_mscale", m.rope_yarn_mscale);
    check.non_negative("model.rope_yarn_mscale_all_dim", m.rope_yarn_mscale_all_dim);
    return;
  }
  check.positive("model.rope_low_freq_factor", m.rope_low_freq_factor);
  // The smoothing divides by high - low.
  if (!(m.rope_high_freq_factor > m.rope_low_freq_factor)) {
    check.fail_value("model.rope_high_freq_factor",
                     "must be > " + check.key("model.rope_low_freq_factor") + " (" +
                         std::to_string(m.rope_low_freq_factor) + ")");
  }
}

}  // namespace

const std::vector<ModelEntry>& model_registry() {
  // One line per model; the first is the default model.name.
  static const std::vector<ModelEntry> models = {
      qwen2_moe::qwen2_moe_entry(),
      qwen2_moe::qwen3_moe_entry(),
      qwen2::qwen2_entry(),
      qwen2::llama_entry(),
      qwen3::qwen3_entry(),
      mistral::mistral_entry(),
      deepseek_v3::deepseek_v3_entry(),
  };
  return models;
}

void register_model_sections() {
  static std::once_flag once;
  std::call_once(once, [] {
    bool first = true;
    for (const ModelEntry& entry : model_registry()) {
      register_model_section(entry.section, first);
      first = false;
    }
    register_moe_config_section();  // the routed-expert models' own keys
    register_sliding_window_section();
    register_deepseek_v3_config_section();
    ConfigSectionSpec models;
    models.name = "model";
    models.check = check_rope_scaling;
    models.resolve = apply_hf_config;  // model.hf_config / model.init_from
    register_config_section(models);
  });
}

std::shared_ptr<CausalLM> build_model(const ModelConfig& config, uint64_t seed) {
  for (const auto& entry : model_registry()) {
    if (entry.name != config.name) continue;
    auto model = entry.make(config, seed);
    for (const auto& item : model->named_parameters(/*recurse=*/true)) {
      try {
        model->param_role(item.key());
      } catch (const std::invalid_argument& e) {
        throw std::logic_error(std::string(e.what()) + " (the model must assign every role)");
      }
    }
    return model;
  }
  std::string known;
  for (const auto& entry : model_registry()) known += (known.empty() ? "" : ", ") + entry.name;
  throw ConfigError(ConfigKey{"model.name"},
                    "unknown model '" + config.name + "' (known: " + known + ")");
}

std::vector<std::string> registered_model_names() {
  std::vector<std::string> names;
  for (const auto& entry : model_registry()) names.push_back(entry.name);
  return names;
}

}  // namespace mixtrain
