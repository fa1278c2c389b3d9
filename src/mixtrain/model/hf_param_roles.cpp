#include "mixtrain/model/hf_param_roles.h"

#include <optional>

#include "mixtrain/model/deepseek_v3_config.h"

namespace mixtrain {
namespace {

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// The role of `rest`, the part of a name after "model.layers.N.".
std::optional<ParamRoleInfo> layer_role(const std::string& layer, const std::string& rest) {
  const std::string attn = layer + "self_attn.";
  const std::pair<const char*, ParamRole> projections[] = {
      {"self_attn.q_proj.", ParamRole::kAttentionQuery},
      {"self_attn.k_proj.", ParamRole::kAttentionKey},
      {"self_attn.v_proj.", ParamRole::kAttentionValue},
      {"self_attn.o_proj.", ParamRole::kAttentionOutput},
      // deepseek_v3's multi-head latent attention
      {"self_attn.q_b_proj.", ParamRole::kAttentionQuery},
      {"self_attn.q_a_proj.", ParamRole::kAttentionLatent},
      {"self_attn.kv_a_proj_with_mqa.", ParamRole::kAttentionLatent},
      {"self_attn.kv_b_proj.", ParamRole::kAttentionKeyValue}};
  for (const auto& [prefix, role] : projections) {
    if (starts_with(rest, prefix)) return ParamRoleInfo{role, attn};
  }
  for (const char* norm :
       {"self_attn.q_norm.", "self_attn.k_norm.", "self_attn.q_a_layernorm.",
        "self_attn.kv_a_layernorm.", "input_layernorm.", "post_attention_layernorm."}) {
    if (starts_with(rest, norm)) return ParamRoleInfo{ParamRole::kNorm, ""};
  }
  if (starts_with(rest, "mlp.experts.")) return ParamRoleInfo{ParamRole::kExpert, ""};
  if (starts_with(rest, "mlp.gate.") || starts_with(rest, "mlp.shared_expert_gate.")) {
    return ParamRoleInfo{ParamRole::kRouter, ""};
  }
  if (starts_with(rest, "mlp.")) return ParamRoleInfo{ParamRole::kMlp, ""};
  return std::nullopt;
}

std::optional<ParamRoleInfo> role_of(const std::string& name) {
  if (starts_with(name, "model.embed_tokens.")) return ParamRoleInfo{ParamRole::kEmbedding, ""};
  if (starts_with(name, "model.norm.")) return ParamRoleInfo{ParamRole::kNorm, ""};
  if (starts_with(name, "lm_head.")) return ParamRoleInfo{ParamRole::kOutputHead, ""};
  const std::string layers = "model.layers.";
  if (!starts_with(name, layers)) return std::nullopt;
  const size_t dot = name.find('.', layers.size());
  if (dot == std::string::npos || dot == layers.size()) return std::nullopt;
  for (size_t i = layers.size(); i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
  }
  return layer_role(name.substr(0, dot + 1), name.substr(dot + 1));
}

}  // namespace

ParamRoles hf_param_roles(const std::vector<std::string>& names, const ModelConfig* model) {
  ParamRoles roles;
  for (const std::string& name : names) {
    if (const auto role = role_of(name)) roles[name] = *role;
  }
  if (model == nullptr || model->name != "deepseek_v3") return roles;
  const MlaHeadLayouts layouts = mla_head_layouts(*model);
  for (auto& [name, info] : roles) {
    if (info.role == ParamRole::kAttentionQuery) info.heads = layouts.query;
    if (info.role == ParamRole::kAttentionKeyValue) info.heads = layouts.key_value;
    if (info.role == ParamRole::kAttentionOutput) info.heads = layouts.output;
  }
  return roles;
}

}  // namespace mixtrain
