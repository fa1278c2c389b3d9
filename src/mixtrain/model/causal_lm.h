// The model interface the trainer is written against: a causal language model over token ids.
//
// forward() takes int64 input_ids [batch, seq] and returns next-token logits [batch, seq, vocab]
// in the model's compute dtype (the dtype of its parameters) plus the router load-balancing loss
// as a float32 scalar. The loss the trainer minimises is
//   cross_entropy(logits, labels) + config().router_aux_loss_coef * aux_loss;
// the coefficient is applied by the caller, not here, so metrics can report both terms.
// Models without a router return aux_loss = 0.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

struct CausalLMOutput {
  torch::Tensor logits;    // [batch, seq, vocab], in the model's compute dtype
  torch::Tensor aux_loss;  // scalar float32, NOT yet multiplied by router_aux_loss_coef
};

class CausalLM : public torch::nn::Module {
 public:
  virtual CausalLMOutput forward(const torch::Tensor& input_ids) = 0;
  virtual const ModelConfig& config() const = 0;
};

}  // namespace mixtrain
