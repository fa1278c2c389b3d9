// The roles (core/param_role.h) of parameters named in the Hugging Face decoder layout every
// model here uses (layers.h: model.embed_tokens, model.layers.N.self_attn.{q,k,v,o}_proj and
// {q,k}_norm, mlp.{gate,up,down}_proj, mlp.gate, mlp.experts, mlp.shared_expert(_gate), the
// layer norms, model.norm, lm_head), for parameters that come without a model: optim-replay's
// files. A built model's own roles (CausalLM::param_roles) are what training uses;
// tests/unit/model/hf_param_roles_test.cpp checks both agree for every registered model.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/core/param_role.h"

namespace mixtrain {

// Names outside the layout get no entry.
ParamRoles hf_param_roles(const std::vector<std::string>& names);

}  // namespace mixtrain
