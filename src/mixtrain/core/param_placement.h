// How one parameter is held across ranks: the descriptor a parallel layout (distributed/) builds
// once per parameter and that everything above the model reads (gradient clipping, distributed
// Muon, checkpoint placement, optim-replay) without knowing which layout made it.
//
//   kWhole       this rank holds the whole parameter and no other rank takes part (one rank).
//   kDim0Shard   rows [offset, offset + rows) of global_shape's dim 0 (torch.chunk split: FSDP);
//                the pieces over shard_group are disjoint and make the whole; replicate_group
//                holds copies of this piece (HSDP's dp_replicate; a one-rank group otherwise).
//   kExpertSlice rows [offset, offset + rows) are whole experts (expert parallelism): disjoint
//                over shard_group (the ep group), copies over replicate_group (expert_dp).
//   kReplicated  the whole parameter, identical on every rank of replicate_group (DDP).
// offset/rows always describe dim 0 of tp_shape() (kWhole / kReplicated: 0 and its dim 0).
//
// Tensor parallelism (tp_dim >= 0): first the parameter is split evenly along tp_dim over
// tp_group (tp rank t holds index range [t * n, (t+1) * n), n = global_shape[tp_dim] / tp), then
// that slice, of shape tp_shape(), is held as `kind` says. The tp ranks' slices are disjoint and
// make the whole; with tp_dim = -1 every tp rank holds the same piece (tp_group unused).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/collectives.h"

namespace mixtrain {

struct ParamPlacement {
  enum class Kind { kWhole, kDim0Shard, kExpertSlice, kReplicated };
  std::string name;  // the parameter's fully qualified name
  Kind kind = Kind::kWhole;
  std::vector<int64_t> global_shape;
  int64_t offset = 0;
  int64_t rows = 0;
  std::shared_ptr<Collectives> shard_group;      // kDim0Shard, kExpertSlice
  std::shared_ptr<Collectives> replicate_group;  // kDim0Shard, kExpertSlice, kReplicated
  int64_t tp_dim = -1;
  std::shared_ptr<Collectives> tp_group;  // tp_dim >= 0

  bool tp_split() const { return tp_dim >= 0 && tp_group && tp_group->size() > 1; }
  // global_shape with tp_dim divided by the tp degree (global_shape when not tp_split()).
  std::vector<int64_t> tp_shape() const;
  // Where this rank's piece starts in global_shape, per dim, and its extent.
  std::vector<int64_t> global_offsets() const;
  std::vector<int64_t> local_sizes() const;

  // The group whose ranks hold disjoint pieces that together make the whole parameter: where a
  // sum over the parameter's elements must be all-reduced. Null for kWhole and kReplicated
  // (this rank's piece is the whole).
  const std::shared_ptr<Collectives>& pieces_group() const;
};

// A kWhole placement of a parameter of `shape` (what a single-rank run has for every parameter).
ParamPlacement whole_placement(const std::string& name, const std::vector<int64_t>& shape);

}  // namespace mixtrain
