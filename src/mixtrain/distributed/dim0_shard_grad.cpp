#include "mixtrain/distributed/dim0_shard_grad.h"

namespace mixtrain {

at::Tensor reduce_dim0_shard_grad(const at::Tensor& full_grad, const ShardLayout& layout,
                                  Collectives& shard_group, Collectives& replicate_group) {
  const int64_t shards = shard_group.size(), replicas = replicate_group.size();
  at::Tensor grad;
  if (shards > 1) {
    grad = shard_group.reduce_scatter_sum(
        pad_rows(full_grad.to(at::kFloat), shards * layout.chunk_rows));
    grad = grad.narrow(0, 0, layout.rows).contiguous();
  } else {
    grad = full_grad.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
  }
  if (replicas > 1) replicate_group.all_reduce_sum(grad);
  // Each rank's loss is the mean over its own batch: the mean over ranks is the gradient of
  // the mean over the global batch.
  if (shards * replicas > 1) grad.div_(static_cast<double>(shards * replicas));
  return grad;
}

}  // namespace mixtrain
