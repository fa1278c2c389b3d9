#include "mixtrain/core/param_placement.h"

namespace mixtrain {

const std::shared_ptr<Collectives>& ParamPlacement::pieces_group() const {
  static const std::shared_ptr<Collectives> none;
  return kind == Kind::kDim0Shard || kind == Kind::kExpertSlice ? shard_group : none;
}

ParamPlacement whole_placement(const std::string& name, const std::vector<int64_t>& shape) {
  ParamPlacement p;
  p.name = name;
  p.global_shape = shape;
  p.rows = shape.empty() ? 0 : shape[0];
  return p;
}

}  // namespace mixtrain
