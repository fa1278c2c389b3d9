#include "mixtrain/model/max_logit_recorder.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <limits>

namespace mixtrain {

void MaxLogitRecorder::record(const std::string& layer, int64_t num_heads, int64_t head_offset,
                              const torch::Tensor& local_max) {
  TORCH_CHECK(
      local_max.dim() == 1 && head_offset >= 0 && head_offset + local_max.size(0) <= num_heads,
      "MaxLogitRecorder: heads [", head_offset, ", ", head_offset + local_max.size(0),
      ") do not fit a layer of ", num_heads);
  at::NoGradGuard no_grad;
  auto it = layers_.find(layer);
  if (it == layers_.end()) {
    it = layers_
             .emplace(layer, at::full({num_heads}, -std::numeric_limits<float>::infinity(),
                                      local_max.options().dtype(at::kFloat)))
             .first;
  }
  TORCH_CHECK(it->second.size(0) == num_heads, "MaxLogitRecorder: layer ", layer, " has ",
              it->second.size(0), " heads, not ", num_heads);
  at::Tensor slot = it->second.narrow(0, head_offset, local_max.size(0));
  slot.copy_(at::maximum(slot, local_max.to(at::kFloat)));
}

}  // namespace mixtrain
