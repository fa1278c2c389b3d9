// What each parameter of a model is, as the model declares it (model/causal_lm.h
// CausalLM::param_roles): the one source optimizers and parallelisms ask instead of reading
// parameter names. Attention projections carry their layer (the key the layer's max logits are
// recorded under, model/max_logit_recorder.h), so QK-clip finds a layer's queries and keys.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace mixtrain {

enum class ParamRole {
  kEmbedding,        // token embedding table
  kAttentionQuery,   // q projection (weight and bias): rows are query heads
  kAttentionKey,     // k projection: rows are key/value heads
  kAttentionValue,   // v projection: rows are key/value heads
  kAttentionOutput,  // o projection: columns are query heads
  // Multi-head latent attention (model/deepseek_v3.h): the low-rank down projections (q_a_proj,
  // kv_a_proj_with_mqa: not per head), and kv_b_proj, whose rows are per head the key's
  // content part then the value.
  kAttentionLatent,
  kAttentionKeyValue,
  kMlp,         // dense feed-forward (a dense model's MLP, a MoE model's shared expert)
  kRouter,      // MoE router (gate) and the shared-expert gate
  kExpert,      // routed experts, expert dim 0
  kNorm,        // normalisation scales (incl. per-head q/k norms)
  kOutputHead,  // the output projection to the vocabulary (lm_head)
};

// "embedding", "attention_query", ..., "output_head".
const char* param_role_name(ParamRole role);

// q, k, v or o.
bool is_attention_projection(ParamRole role);

// How an attention projection's rows (dim 0; o: columns, dim 1) fall into heads when it is not
// the standard layout of model.head_dim per head, all of it q or k content: multi-head latent
// attention's q_b_proj has per head `content` (dn) rows then `rotary` (dr) rows, its kv_b_proj
// `content` (dn, the key) rows then the value's, its o_proj dv columns. Muon's per-head split
// cuts blocks of `block`; QK-clip scales content rows by sqrt(gamma), a query's rotary rows by
// gamma, value rows not at all. block 0: the standard layout.
struct HeadLayout {
  int64_t block = 0;
  int64_t content = 0;
  int64_t rotary = 0;
};

// `layout`, or for the standard layout (block 0) its explicit form: blocks of head_dim rows, all
// content.
inline HeadLayout head_layout_or_standard(const HeadLayout& layout, int64_t head_dim) {
  return layout.block > 0 ? layout : HeadLayout{head_dim, head_dim, 0};
}

struct ParamRoleInfo {
  // A constructor (not an aggregate): {role} and {role, layer} leave the layout standard.
  ParamRoleInfo(ParamRole role = ParamRole::kMlp, std::string attention_layer = "",
                HeadLayout heads = {})
      : role(role), attention_layer(std::move(attention_layer)), heads(heads) {}

  ParamRole role;
  std::string attention_layer;  // attention projections: their layer's key; "" otherwise
  HeadLayout heads;             // attention projections with their own layout
};

// By parameter name (a key of the model's named_parameters()).
using ParamRoles = std::map<std::string, ParamRoleInfo>;

}  // namespace mixtrain
