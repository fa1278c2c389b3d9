// The roles (core/param_role.h) of parameters named in the Hugging Face decoder layout every
// model here uses (layers.h: model.embed_tokens, model.layers.N.self_attn.{q,k,v,o}_proj and
// {q,k}_norm, deepseek_v3's q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
// kv_a_layernorm, kv_b_proj, mlp.{gate,up,down}_proj, mlp.gate, mlp.experts,
// mlp.shared_expert(_gate), mlp.shared_experts, the layer norms, model.norm, lm_head), for
// parameters that come without a model: optim-replay's files. A built model's own roles
// (CausalLM::param_roles) are what training uses; tests/unit/model/hf_param_roles_test.cpp checks
// both agree for every registered model.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/core/param_role.h"

namespace mixtrain {

// Names outside the layout get no entry. With `model` (optional) a deepseek_v3 model's
// latent-attention projections also get their HeadLayout (Muon's per-head blocks, QK-clip), as
// the built model declares them.
ParamRoles hf_param_roles(const std::vector<std::string>& names,
                          const ModelConfig* model = nullptr);

}  // namespace mixtrain
