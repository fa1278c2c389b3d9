// Parameter grouping shared by every optimizer: which parameters get weight decay.
//
// docs/architecture.md §5 (YAML dialect, as hyper-parallel and Megatron do): a parameter whose
// fully qualified name contains "bias", "norm" or "ln_" gets weight decay 0; everything else gets
// the configured weight decay.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace mixtrain {

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

bool is_no_decay_parameter(const std::string& name);

struct DecaySplit {
  NamedParameters decay;
  NamedParameters no_decay;
};

// Splits trainable parameters (requires_grad) by is_no_decay_parameter, keeping model order.
DecaySplit split_by_weight_decay(const NamedParameters& params);

}  // namespace mixtrain
