#include "mixtrain/distributed/dim0_shard_grad.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace mixtrain {
namespace {

// Rows [begin, begin + n) of every rank's chunk, rank by rank, as one float32 tensor of
// shards x n rows: the wire form of one block. Rows past the parameter's end are zero (the
// padding of pad_rows).
at::Tensor block_of_chunks(const at::Tensor& full_grad, const ShardLayout& layout, int64_t shards,
                           int64_t begin, int64_t n) {
  std::vector<int64_t> shape = full_grad.sizes().vec();
  shape[0] = shards * n;
  at::Tensor block = at::empty(shape, full_grad.options().dtype(at::kFloat));
  for (int64_t j = 0; j < shards; ++j) {
    const int64_t first = j * layout.chunk_rows + begin;
    const int64_t have = std::clamp<int64_t>(full_grad.size(0) - first, 0, n);
    if (have > 0) block.narrow(0, j * n, have).copy_(full_grad.narrow(0, first, have));
    if (have < n) block.narrow(0, j * n + have, n - have).zero_();
  }
  return block;
}

}  // namespace

at::Tensor reduce_dim0_shard_grad(const at::Tensor& full_grad, const ShardLayout& layout,
                                  Collectives& shard_group, Collectives& replicate_group,
                                  int64_t block_bytes) {
  const int64_t shards = shard_group.size(), replicas = replicate_group.size();
  at::Tensor grad;
  const int64_t row_bytes =
      full_grad.size(0) > 0 ? 4 * (full_grad.numel() / full_grad.size(0)) * shards : 0;
  const int64_t block_rows = row_bytes > 0 ? std::max<int64_t>(1, block_bytes / row_bytes) : 0;
  if (shards > 1 && block_rows > 0 && block_rows < layout.chunk_rows) {
    std::vector<int64_t> shape = full_grad.sizes().vec();
    shape[0] = layout.chunk_rows;
    grad = at::empty(shape, full_grad.options().dtype(at::kFloat));
    for (int64_t begin = 0; begin < layout.chunk_rows; begin += block_rows) {
      const int64_t n = std::min(block_rows, layout.chunk_rows - begin);
      grad.narrow(0, begin, n)
          .copy_(
              shard_group.reduce_scatter_sum(block_of_chunks(full_grad, layout, shards, begin, n)));
    }
    grad = grad.narrow(0, 0, layout.rows).contiguous();
  } else if (shards > 1) {
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
