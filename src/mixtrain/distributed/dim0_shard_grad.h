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
#pragma once

#include <ATen/core/Tensor.h>

#include "mixtrain/core/collectives.h"
#include "mixtrain/distributed/shard_layout.h"

namespace mixtrain {

at::Tensor reduce_dim0_shard_grad(const at::Tensor& full_grad, const ShardLayout& layout,
                                  Collectives& shard_group, Collectives& replicate_group);

}  // namespace mixtrain
