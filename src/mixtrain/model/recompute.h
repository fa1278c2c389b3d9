// Activation checkpointing (train.activation_checkpointing; torch.utils.checkpoint's reentrant
// form): recompute_in_backward(fn, inputs) runs fn(inputs) without recording its graph, so only
// the inputs are kept; the backward runs fn again on detached copies of the inputs with autograd
// on and backpropagates the output gradients through that graph (a nested backward: the
// parameters fn reads receive their gradients there, through whatever path the forward takes,
// e.g. FSDP's gathers and reduce-scatters), then hands the inputs' gradients on. fn must be
// deterministic (no RNG: the models here have no dropout), so the recomputed values, and with them
// every gradient, are bitwise those of the plain forward.
// Without grad mode the call is fn(inputs). Outputs that are not floating point get no gradient.
#pragma once

#include <torch/types.h>

#include <functional>
#include <vector>

namespace mixtrain {

using RecomputeFn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

std::vector<torch::Tensor> recompute_in_backward(const RecomputeFn& fn,
                                                 const std::vector<torch::Tensor>& inputs);

// Whether the calling thread is inside the backward's second run of a recompute_in_backward fn
// (a forward that collects statistics, e.g. expert loads, must not count them twice).
bool recomputing();

// Whether decoder layer `index` (0-based) recomputes under activation checkpointing every `every`
// layers (0: none; 1: every layer, "full"; k: "selective", layers k-1, 2k-1, ... as torchtitan
// counts its wrapped blocks from 1).
inline bool recomputes_layer(int64_t index, int64_t every) {
  return every > 0 && (index + 1) % every == 0;
}

}  // namespace mixtrain
