// Global gradient-norm clipping, as torch.nn.utils.clip_grad_norm_ with norm_type 2.
//
// The norm is computed in double from the vectorized sum-of-squares kernel
// (kernels/sum_of_squares_kernel.h, dispatched on cpu_capability()): float32, bfloat16 and
// float16 CPU tensors take the kernel; such tensors on a CUDA device take its deterministic CUDA
// twin (sum_of_squares_fused.h: one pass, a device sum, read back once as this API returns a
// double, the value the trainer logs); any other tensor (float64, a second CUDA device) is summed
// by ATen in double. Undefined tensors are skipped; non-contiguous ones are made contiguous for the
// norm. The result is bit-identical for any thread count and from run to run.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "mixtrain/core/param_placement.h"

namespace mixtrain {

class Collectives;

// Sum of squares of one tensor's elements, in double (0 for an undefined tensor).
double sum_of_squares(const at::Tensor& tensor);

// Global L2 norm over all tensors: sqrt of the sum of their squares (kernel chunks added in
// tensor order; float64 / non-CPU tensors added after them).
double global_grad_norm(const std::vector<at::Tensor>& grads);

// Scales every grad in place by max_norm / (norm + 1e-6) when that coefficient is < 1
// (torch's formula) and returns the pre-clip norm. max_norm <= 0: no clipping, just the norm.
// A non-finite norm is returned as is and the grads are left untouched (the caller decides:
// skip the step, or fail).
double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm);

// Distributed variants (docs/architecture.md §3): `grads` are this rank's pieces of the gradients
// and `group` the ranks whose pieces are disjoint and together make the whole (FSDP: dp_shard;
// replicas of the same shard are left out, so each element counts once). The local sums of squares
// (double) are all-reduced over `group`; every rank gets the same norm and clips with the same
// coefficient. A one-rank group gives exactly the functions above. Collective over `group`.
double global_grad_norm(const std::vector<at::Tensor>& grads, Collectives& group);
double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, Collectives& group);

// Placed form: grads[i] (undefined: no gradient) is this rank's piece of the parameter that
// placements[i] describes. Squares are summed per pieces_group() (null: this rank's piece is
// the whole parameter, counted here) and tp group (a tp_split() parameter's tp slices are
// disjoint: its sum is then all-reduced over tp_group too; tp_dim -1: every tp rank holds the
// same piece, counted once): one kernel call per (pieces group, tp group) over its grads in list
// order, all-reduced over the pieces group, then the tp group, each when it has more than one
// rank; pairs are taken in order of first appearance in `placements` (undefined grads
// included), so every rank issues the same collectives. The norm is the square root of the
// pairs' total; clipping as above. With one group and no tp this is exactly
// clip_grad_norm(grads, max_norm, group).
double clip_grad_norm(const std::vector<at::Tensor>& grads,
                      const std::vector<const ParamPlacement*>& placements, double max_norm);
// The placed form without a host read when every defined grad is on one CUDA device (in a
// kernel dtype): the sums stay on the device (all-reduced there over NCCL groups), the
// coefficient min(1, max_norm / (norm + 1e-6)) (1 for a non-finite norm) scales every grad in
// one multi-tensor multiply, and the norm is returned as a 0-dim float64 device tensor for the
// caller to read when it logs. The same arithmetic in the same order as the form above, so the
// same bits. Otherwise the form above, its norm as a 0-dim float64 CPU tensor.
at::Tensor clip_grad_norm_unread(const std::vector<at::Tensor>& grads,
                                 const std::vector<const ParamPlacement*>& placements,
                                 double max_norm);

}  // namespace mixtrain
