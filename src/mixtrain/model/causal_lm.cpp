#include "mixtrain/model/causal_lm.h"

#include <torch/nn/functional/loss.h>

#include <stdexcept>

namespace mixtrain {

void CausalLM::set_model_state(const std::string& name, const torch::Tensor& value) {
  (void)value;
  throw std::invalid_argument("model state '" + name + "' is not one of this model's");
}

ParamRole CausalLM::param_role(const std::string& name) const {
  const auto it = roles_.find(name);
  if (it == roles_.end()) {
    throw std::invalid_argument("model " + config().name + ": no parameter role for '" + name +
                                "'");
  }
  return it->second.role;
}

void CausalLM::assign_param_role(const std::string& prefix, torch::nn::Module& module,
                                 ParamRole role, const std::string& attention_layer,
                                 const HeadLayout& heads) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    roles_[prefix + item.key()] = {role, attention_layer, heads};
  }
}

int64_t CausalLM::tp_dim(const std::string& name) const {
  const auto it = tp_dims_.find(name);
  return it == tp_dims_.end() ? -1 : it->second;
}

void CausalLM::assign_tp_dim(const std::string& prefix, torch::nn::Module& module, int64_t dim,
                             bool weight_only) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (weight_only && item.key() != "weight") continue;
    tp_dims_[prefix + item.key()] = dim;
  }
}

torch::Tensor causal_lm_cross_entropy(const CausalLM& model, const torch::Tensor& logits,
                                      const torch::Tensor& labels, bool per_token) {
  const int64_t vocab = logits.size(-1);
  const torch::Tensor flat_logits = logits.reshape({-1, vocab}).to(torch::kFloat);
  const torch::Tensor flat_labels = labels.reshape({-1});
  const auto& materializer = model.parameter_materializer();
  TensorParallelHooks* tp = materializer ? materializer->tensor_parallel() : nullptr;
  if (tp != nullptr) {
    const torch::Tensor losses = tp->vocab_parallel_cross_entropy(flat_logits, flat_labels);
    return per_token ? losses : losses.mean();
  }
  namespace F = torch::nn::functional;
  auto options = F::CrossEntropyFuncOptions();
  if (per_token) options.reduction(torch::kNone);
  return F::cross_entropy(flat_logits, flat_labels, options);
}

}  // namespace mixtrain
