#include "mixtrain/optim/muon_heads.h"

#include <c10/util/Exception.h>

#include <stdexcept>

namespace mixtrain {
std::pair<int64_t, int64_t> muon_matrix_shape(at::IntArrayRef shape, const MuonHeadSplit& split,
                                              const std::string& what) {
  const auto n = static_cast<int64_t>(shape.size());
  if (!split.active()) return {shape[n - 2], shape[n - 1]};
  if (n != 2 || split.dim > 1 || split.block < 1 || shape[split.dim] % split.block != 0) {
    throw std::invalid_argument("Muon per-head split of " + what + ": shape " + c10::str(shape) +
                                " cannot be cut into heads of " + std::to_string(split.block) +
                                " along dim " + std::to_string(split.dim) +
                                " (check model.head_dim)");
  }
  return split.dim == 0 ? std::pair{split.block, shape[1]} : std::pair{shape[0], split.block};
}

at::Tensor split_heads(const at::Tensor& matrix, const MuonHeadSplit& split) {
  const auto [rows, cols] = muon_matrix_shape(matrix.sizes(), split, "a matrix");
  if (split.dim != 1) return matrix.reshape({-1, rows, cols});
  return matrix.view({rows, -1, cols}).permute({1, 0, 2});  // [R, H, D] -> [H, R, D]
}

at::Tensor merge_heads(const at::Tensor& heads, at::IntArrayRef shape, const MuonHeadSplit& split) {
  if (split.dim != 1) return heads.reshape(shape).contiguous();
  return heads.permute({1, 0, 2}).reshape(shape).contiguous();
}

std::optional<MuonHeadSplit> attention_head_split(ParamRole role, int64_t head_dim) {
  switch (role) {
    case ParamRole::kAttentionQuery:
    case ParamRole::kAttentionKey:
    case ParamRole::kAttentionValue:
    case ParamRole::kAttentionKeyValue:
      return MuonHeadSplit{0, head_dim};
    case ParamRole::kAttentionOutput:
      return MuonHeadSplit{1, head_dim};
    default:
      return std::nullopt;
  }
}

}  // namespace mixtrain
