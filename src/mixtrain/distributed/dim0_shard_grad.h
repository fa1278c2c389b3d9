// The gradient path of a parameter held as dim-0 rows (ParamPlacement kDim0Shard, and its
// one-shard cases kReplicated and kWhole): from the full gradient every rank computed on its
// own batch to this rank's rows of the mean over all data-parallel ranks, in float32.
//
//   g = float32(full_grad);  shards > 1: reduce_scatter_sum over shard_group (rows padded to
//   shards x chunk_rows), keep this rank's rows;  replicas > 1: all_reduce_sum over
//   replicate_group;  g /= shards x replicas.
//
// float32 on the wire and in the sums whatever the compute dtype: Gloo cannot reduce bfloat16,
// and the fp32 main_grad wants the unrounded sum (fp32-main-params §8.1). Collective over both
// groups; the result is a new contiguous tensor.
//
// A gradient whose float32 wire form (shards x chunk_rows rows) exceeds `block_bytes` is
// reduce-scattered in blocks of rows: call b carries rows [b k, (b + 1) k) of every rank's
// chunk, so the float32 copy and the receive buffer hold one block, not the whole parameter (a
// 151,936 x 2048 output head on 2 ranks: 2 x 64 MiB instead of 2 x 1.2 GiB). Every element is
// still the sum of the same terms in rank order (Gloo), so the result is the same bits; every
// rank makes the same calls, as the block size depends on shapes only.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "mixtrain/core/collectives.h"
#include "mixtrain/distributed/shard_layout.h"

namespace mixtrain {

at::Tensor reduce_dim0_shard_grad(const at::Tensor& full_grad, const ShardLayout& layout,
                                  Collectives& shard_group, Collectives& replicate_group,
                                  int64_t block_bytes = int64_t{64} << 20);

}  // namespace mixtrain
