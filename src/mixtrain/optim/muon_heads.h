// Per-head orthogonalization (muon_per_head, docs/architecture.md §5), as Kimi and Dion's
// num_heads: Newton–Schulz runs on each attention head's block of q/k/v/o instead of on the
// whole matrix.
//   dim 0 (q/k/v, [H*D, C]): H matrices D x C, rows [h*D, (h+1)*D);
//   dim 1 (o, [R, H*D]):     H matrices R x D, columns [h*D, (h+1)*D).
// D is `block` (model.head_dim). The update scale (adjust_lr_fn) then uses the head matrix's
// shape. The split applies to the whole matrix: FSDP and tensor-parallel paths split after
// assembling it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "mixtrain/core/param_role.h"

namespace mixtrain {

struct MuonHeadSplit {
  int64_t dim = -1;   // 0 or 1; -1: the whole matrix
  int64_t block = 0;  // D, the head size along dim
  bool active() const { return dim >= 0; }
};

// (rows, cols) of each matrix Muon orthogonalizes in a tensor of `shape` (its last two dims,
// or one head of them). Throws std::invalid_argument naming `what` when a split is set on a
// tensor that is not 2-D or whose split dim is not a multiple of block.
std::pair<int64_t, int64_t> muon_matrix_shape(at::IntArrayRef shape, const MuonHeadSplit& split,
                                              const std::string& what);

// The heads of a whole 2-D matrix as [H, rows, cols]: a view for dim 0, a permuted view
// (not contiguous) for dim 1. No split: matrix.reshape({-1, rows, cols}).
at::Tensor split_heads(const at::Tensor& matrix, const MuonHeadSplit& split);
// The inverse: [H, rows, cols] back to a contiguous tensor of `shape`.
at::Tensor merge_heads(const at::Tensor& heads, at::IntArrayRef shape, const MuonHeadSplit& split);

// The split of a 2-D weight of `role` under muon_per_head: q, k and v projections (and latent
// attention's kv_b_proj) split dim 0 (rows are heads), the o projection dim 1 (columns are
// heads), blocks of head_dim (the caller passes the role's HeadLayout block where it has one);
// nullopt for every other role (latent attention's low-rank down projections stay whole).
std::optional<MuonHeadSplit> attention_head_split(ParamRole role, int64_t head_dim);

}  // namespace mixtrain
