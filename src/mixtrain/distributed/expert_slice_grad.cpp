#include "mixtrain/distributed/expert_slice_grad.h"

#include <ATen/ops/zeros.h>

namespace mixtrain {

void ExpertSliceGrads::add(int64_t index, const at::Tensor& full_grad) {
  at::Tensor& pending = pending_[index];
  if (pending.defined()) {
    pending.add_(full_grad.to(at::kFloat));
  } else {
    pending = full_grad.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
  }
}

at::Tensor ExpertSliceGrads::reduce(int64_t index, at::IntArrayRef shape, at::Device device,
                                    Collectives& expert_dp, double data_parallel_ranks) {
  const auto it = pending_.find(index);
  at::Tensor grad;
  if (it != pending_.end()) {
    grad = it->second;
    pending_.erase(it);
  } else {
    grad = at::zeros(shape, at::TensorOptions().dtype(at::kFloat).device(device));
  }
  if (expert_dp.size() > 1) expert_dp.all_reduce_sum(grad);
  grad.div_(data_parallel_ranks);
  return grad;
}

}  // namespace mixtrain
