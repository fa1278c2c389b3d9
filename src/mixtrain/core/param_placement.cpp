#include "mixtrain/core/param_placement.h"

namespace mixtrain {

const std::shared_ptr<Collectives>& ParamPlacement::pieces_group() const {
  static const std::shared_ptr<Collectives> none;
  return kind == Kind::kDim0Shard || kind == Kind::kExpertSlice ? shard_group : none;
}

std::vector<int64_t> ParamPlacement::tp_shape() const {
  std::vector<int64_t> shape = global_shape;
  if (tp_split()) shape[tp_dim] /= tp_group->size();
  return shape;
}

std::vector<int64_t> ParamPlacement::global_offsets() const {
  std::vector<int64_t> offsets(global_shape.size(), 0);
  if (offsets.empty()) return offsets;
  offsets[0] = offset;
  if (tp_split()) offsets[tp_dim] += tp_group->rank() * (global_shape[tp_dim] / tp_group->size());
  return offsets;
}

std::vector<int64_t> ParamPlacement::local_sizes() const {
  std::vector<int64_t> sizes = tp_shape();
  if (!sizes.empty()) sizes[0] = rows;
  return sizes;
}

ParamPlacement whole_placement(const std::string& name, const std::vector<int64_t>& shape) {
  ParamPlacement p;
  p.name = name;
  p.global_shape = shape;
  p.rows = shape.empty() ? 0 : shape[0];
  return p;
}

}  // namespace mixtrain
