// Step-level helpers of data-parallel training (FSDP, HSDP, DDP; docs/architecture.md §3, issue 4
// part 8): the numbers every rank must agree on.
//
// average_over_data_parallel: the mean of a per-rank scalar or vector (the loss, a mean over the
// rank's own batch) over every data-parallel rank, so every rank reports the loss of the global
// batch. Collective: every rank calls it in the same order. (Gradient clipping over sharded pieces
// is the optimizer's, from each parameter's placement: ChainedOptimizer::clip_grad_norm.)
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mixtrain/distributed/device_mesh.h"

namespace mixtrain {

// Mean of `value` over mesh.world (every rank of a data-parallel mesh is one data-parallel
// rank; expert parallelism lives inside dp_shard). Summed in double.
double average_over_data_parallel(double value, const DeviceMesh& mesh);
// The same for every element of a float64 CPU tensor at once (one all-reduce): the mean of each
// element, as the scalar form computes it. A new tensor; `values` is left as it was.
at::Tensor average_over_data_parallel(const at::Tensor& values, const DeviceMesh& mesh);

}  // namespace mixtrain
