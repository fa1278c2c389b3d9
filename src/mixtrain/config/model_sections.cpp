#include "mixtrain/config/model_sections.h"

namespace mixtrain {
namespace {

// The keys both MoE models read.
void check_moe(const ModelConfig& m, const ModelKeyChecker& check) {
  check.positive("model.moe_intermediate_size", m.moe_intermediate_size);
  check.positive("model.num_experts", m.num_experts);
  check.positive("model.num_experts_per_tok", m.num_experts_per_tok);
  check.non_negative("model.router_aux_loss_coef", m.router_aux_loss_coef);
  if (m.num_experts_per_tok > m.num_experts) {
    check.fail_value("model.num_experts_per_tok",
                     "must be <= model.num_experts (" + std::to_string(m.num_experts) + ")");
  }
}

void check_qwen2_moe(const ModelConfig& m, const ModelKeyChecker& check) {
  check_moe(m, check);
  check.positive("model.shared_expert_intermediate_size", m.shared_expert_intermediate_size);
}

void check_dense(const ModelConfig& m, const ModelKeyChecker& check) {
  check.positive("model.intermediate_size", m.intermediate_size);
}

void check_qwen2(const ModelConfig& m, const ModelKeyChecker& check) {
  check_dense(m, check);
  // HF Qwen2Attention has q/k/v biases unconditionally: a bias-free Qwen2 would not be Qwen2.
  if (!m.attention_bias) {
    check.fail_value("model.attention_bias",
                     "must be true for model qwen2 (its q/k/v projections always have biases); "
                     "model llama has bias-free attention");
  }
}

int64_t experts_of(const ModelConfig& m) {
  return m.num_experts;
}
int64_t no_experts(const ModelConfig&) {
  return 0;
}

// Column-parallel MLP widths (the routed experts are not split over tp).
std::vector<std::pair<std::string, int64_t>> dense_tp_sizes(const ModelConfig& m) {
  return {{"model.intermediate_size", m.intermediate_size}};
}
std::vector<std::pair<std::string, int64_t>> shared_expert_tp_sizes(const ModelConfig& m) {
  return {{"model.shared_expert_intermediate_size", m.shared_expert_intermediate_size}};
}
std::vector<std::pair<std::string, int64_t>> no_tp_sizes(const ModelConfig&) {
  return {};
}

}  // namespace

const std::vector<ModelSection>& model_sections() {
  static const std::vector<ModelSection> sections = {
      {"qwen2_moe",
       {"model.moe_intermediate_size", "model.num_experts", "model.num_experts_per_tok",
        "model.shared_expert_intermediate_size", "model.router_aux_loss_coef",
        "model.attention_bias", "model.norm_topk_prob"},
       check_qwen2_moe,
       experts_of,
       shared_expert_tp_sizes},
      {"qwen3_moe",
       {"model.moe_intermediate_size", "model.num_experts", "model.num_experts_per_tok",
        "model.router_aux_loss_coef", "model.attention_bias", "model.norm_topk_prob"},
       check_moe,
       experts_of,
       no_tp_sizes,
       /*qk_norm=*/true},
      {"qwen2",
       {"model.intermediate_size", "model.attention_bias"},
       check_qwen2,
       no_experts,
       dense_tp_sizes},
      {"llama",
       {"model.intermediate_size", "model.attention_bias"},
       check_dense,
       no_experts,
       dense_tp_sizes},
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
