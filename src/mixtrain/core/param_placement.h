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
// offset/rows always describe dim 0 (kWhole / kReplicated: 0 and global_shape[0]).
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

  // The group whose ranks hold disjoint pieces that together make the whole parameter: where a
  // sum over the parameter's elements must be all-reduced. Null for kWhole and kReplicated
  // (this rank's piece is the whole).
  const std::shared_ptr<Collectives>& pieces_group() const;
};

// A kWhole placement of a parameter of `shape` (what a single-rank run has for every parameter).
ParamPlacement whole_placement(const std::string& name, const std::vector<int64_t>& shape);

}  // namespace mixtrain
