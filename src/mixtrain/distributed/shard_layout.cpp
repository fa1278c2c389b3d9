#include "mixtrain/distributed/shard_layout.h"

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <stdexcept>

namespace mixtrain {

ShardLayout chunk_layout(const std::vector<int64_t>& global_shape, int64_t parts, int64_t index) {
  if (global_shape.empty())
    throw std::invalid_argument("chunk_layout: a 0-dim tensor has no dim 0");
  ShardLayout layout;
  layout.global_shape = global_shape;
  const int64_t rows = global_shape[0];
  layout.chunk_rows = (rows + parts - 1) / parts;
  layout.offset = std::min(rows, index * layout.chunk_rows);
  layout.rows = std::min(rows, layout.offset + layout.chunk_rows) - layout.offset;
  return layout;
}

at::Tensor pad_rows(const at::Tensor& local, int64_t rows) {
  if (local.size(0) == rows) return local.contiguous();
  auto shape = local.sizes().vec();
  shape[0] = rows;
  at::Tensor padded = at::zeros(shape, local.options());
  padded.narrow(0, 0, local.size(0)).copy_(local);
  return padded;
}

}  // namespace mixtrain
