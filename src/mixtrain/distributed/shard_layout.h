// Where one parameter's dim-0 shard sits in the full tensor (torch.chunk's row split), and the
// zero-row padding that gives every rank's shard the same wire shape.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace mixtrain {

struct ShardLayout {
  std::vector<int64_t> global_shape;
  int64_t chunk_rows = 0;  // ceil(global_shape[0] / parts): rows per rank on the wire
  int64_t offset = 0;      // first global row held here
  int64_t rows = 0;        // rows held here (0 .. chunk_rows)
};

// torch.chunk row split of `global_shape[0]` rows over `parts` ranks, seen from `index`.
// std::invalid_argument for a 0-dim shape.
ShardLayout chunk_layout(const std::vector<int64_t>& global_shape, int64_t parts, int64_t index);

// `local` padded with zero rows to `rows` (contiguous; `local` itself when it has them).
at::Tensor pad_rows(const at::Tensor& local, int64_t rows);

}  // namespace mixtrain
