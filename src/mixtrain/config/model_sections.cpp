#include "mixtrain/config/model_sections.h"

namespace mixtrain {
namespace {

void check_qwen2_moe(const ModelConfig& m, const ModelKeyChecker& check) {
  check.positive("model.moe_intermediate_size", m.moe_intermediate_size);
  check.positive("model.num_experts", m.num_experts);
  check.positive("model.num_experts_per_tok", m.num_experts_per_tok);
  check.positive("model.shared_expert_intermediate_size", m.shared_expert_intermediate_size);
  check.non_negative("model.router_aux_loss_coef", m.router_aux_loss_coef);
  if (m.num_experts_per_tok > m.num_experts) {
    check.fail_value("model.num_experts_per_tok",
                     "must be <= model.num_experts (" + std::to_string(m.num_experts) + ")");
  }
}

void check_qwen2(const ModelConfig& m, const ModelKeyChecker& check) {
  check.positive("model.intermediate_size", m.intermediate_size);
}

}  // namespace

const std::vector<ModelSection>& model_sections() {
  static const std::vector<ModelSection> sections = {
      {"qwen2_moe",
       {"model.moe_intermediate_size", "model.num_experts", "model.num_experts_per_tok",
        "model.shared_expert_intermediate_size", "model.router_aux_loss_coef"},
       check_qwen2_moe,
       [](const ModelConfig& m) { return m.num_experts; }},
      {"qwen2",
       {"model.intermediate_size"},
       check_qwen2,
       [](const ModelConfig&) { return int64_t{0}; }},
  };
  return sections;
}

const ModelSection* find_model_section(const std::string& name) {
  for (const auto& section : model_sections()) {
    if (section.name == name) return &section;
  }
  return nullptr;
}

bool model_reads_key(const std::string& model_name, const std::string& key) {
  bool someones = false;
  for (const auto& section : model_sections()) {
    for (const std::string& own : section.own_keys) {
      if (own != key) continue;
      if (section.name == model_name) return true;
      someones = true;
    }
  }
  return !someones;
}

}  // namespace mixtrain
