// The gradient path of routed experts under expert parallelism (ParamPlacement kExpertSlice):
// each rank holds whole experts, so there is nothing to scatter; the ranks holding the same
// experts (expert_dp) sum their gradients once, at the end of backward, in model order, so every
// rank issues the same all_reduces whether or not its experts saw a token.
//
//   add:    pending[index] += float32(full_grad)  (over micro-batch contributions in backward)
//   reduce: g = pending[index] or zeros(shape); all_reduce_sum over expert_dp when it has
//           several ranks; g /= data_parallel_ranks (the mean over every rank's batch).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <unordered_map>

#include "mixtrain/core/collectives.h"

namespace mixtrain {

class ExpertSliceGrads {
 public:
  // Keeps float32(full_grad) (a copy) for parameter `index`, or adds it to what is kept.
  void add(int64_t index, const at::Tensor& full_grad);
  // The reduced mean for `index` (shape of the local expert slice); forgets it. Collective over
  // expert_dp.
  at::Tensor reduce(int64_t index, at::IntArrayRef shape, at::Device device, Collectives& expert_dp,
                    double data_parallel_ranks);
  void clear() { pending_.clear(); }

 private:
  std::unordered_map<int64_t, at::Tensor> pending_;
};

}  // namespace mixtrain
