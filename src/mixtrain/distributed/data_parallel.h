// Step-level helpers of data-parallel training (FSDP, HSDP, DDP; docs/architecture.md §3, issue 4
// part 8): the numbers every rank must agree on.
//
// average_over_data_parallel: the mean of a per-rank scalar (the loss, a mean over the rank's
// own batch) over every data-parallel rank, so every rank reports the loss of the global batch.
// data_parallel_grad_norm / clip_data_parallel_grad_norm: the global L2 norm of the gradients
// whose local pieces (FSDP shards of main_grad) are `grads`, summing squares over dp_shard and
// counting replicas (dp_replicate) once; clipping scales the local pieces by the same global
// coefficient on every rank. All are collective: every rank calls them in the same order.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mixtrain/distributed/device_mesh.h"

namespace mixtrain {

// Mean of `value` over mesh.world (every rank of a data-parallel mesh is one data-parallel
// rank; expert parallelism lives inside dp_shard). Summed in double.
double average_over_data_parallel(double value, const DeviceMesh& mesh);

double data_parallel_grad_norm(const std::vector<at::Tensor>& grads, const DeviceMesh& mesh);

// torch.nn.utils.clip_grad_norm_ over the global norm; returns the pre-clip norm. max_norm <= 0:
// norm only.
double clip_data_parallel_grad_norm(const std::vector<at::Tensor>& grads, double max_norm,
                                    const DeviceMesh& mesh);

}  // namespace mixtrain
