#include "mixtrain/distributed/data_parallel.h"

#include <ATen/ATen.h>

#include "mixtrain/optim/grad_clip.h"

namespace mixtrain {

double average_over_data_parallel(double value, const DeviceMesh& mesh) {
  if (mesh.world->size() == 1) return value;
  at::Tensor total = at::full({1}, value, at::TensorOptions().dtype(at::kDouble));
  mesh.world->all_reduce_sum(total);
  return total.item<double>() / static_cast<double>(mesh.world->size());
}

double data_parallel_grad_norm(const std::vector<at::Tensor>& grads, const DeviceMesh& mesh) {
  // After the reduce every replica holds the same shard: summing over dp_shard only counts
  // each element once.
  return global_grad_norm(grads, *mesh.dp_shard_group);
}

double clip_data_parallel_grad_norm(const std::vector<at::Tensor>& grads, double max_norm,
                                    const DeviceMesh& mesh) {
  return clip_grad_norm(grads, max_norm, *mesh.dp_shard_group);
}

}  // namespace mixtrain
