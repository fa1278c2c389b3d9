#include "mixtrain/core/param_role.h"

namespace mixtrain {

const char* param_role_name(ParamRole role) {
  switch (role) {
    case ParamRole::kEmbedding:
      return "embedding";
    case ParamRole::kAttentionQuery:
      return "attention_query";
    case ParamRole::kAttentionKey:
      return "attention_key";
    case ParamRole::kAttentionValue:
      return "attention_value";
    case ParamRole::kAttentionOutput:
      return "attention_output";
    case ParamRole::kAttentionLatent:
      return "attention_latent";
    case ParamRole::kAttentionKeyValue:
      return "attention_key_value";
    case ParamRole::kMlp:
      return "mlp";
    case ParamRole::kRouter:
      return "router";
    case ParamRole::kExpert:
      return "expert";
    case ParamRole::kNorm:
      return "norm";
    case ParamRole::kOutputHead:
      return "output_head";
  }
  return "unknown";
}

bool is_attention_projection(ParamRole role) {
  return role == ParamRole::kAttentionQuery || role == ParamRole::kAttentionKey ||
         role == ParamRole::kAttentionValue || role == ParamRole::kAttentionOutput ||
         role == ParamRole::kAttentionLatent || role == ParamRole::kAttentionKeyValue;
}

}  // namespace mixtrain
