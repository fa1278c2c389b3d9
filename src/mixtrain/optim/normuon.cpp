#include "mixtrain/optim/normuon.h"

#include <ATen/ATen.h>

#include <vector>

namespace mixtrain {

at::Tensor normuon_normalize(const at::Tensor& orthogonalized, at::Tensor& v, double beta2,
                             double epsilon) {
  TORCH_CHECK(orthogonalized.dim() >= 2, "normuon_normalize: O must be a matrix, got ",
              orthogonalized.sizes());
  TORCH_CHECK(v.scalar_type() == at::kFloat && v.is_contiguous() &&
                  v.sizes() == orthogonalized.sizes().slice(0, orthogonalized.dim() - 1),
              "normuon_normalize: v must be a contiguous float32 tensor of shape ",
              orthogonalized.sizes().slice(0, orthogonalized.dim() - 1), ", got ", v.sizes(), " ",
              v.scalar_type());
  const int64_t m = orthogonalized.size(-2);
  const int64_t n = orthogonalized.size(-1);
  const at::Tensor o = orthogonalized.to(at::kFloat).reshape({-1, m, n});
  const at::Tensor rows = v.view({-1, m});
  // Every reduction per matrix, on its own 2-D slice: a batched reduction may split its sums
  // differently (CPU threads, CUDA block shapes depend on the number of outputs).
  for (int64_t i = 0; i < o.size(0); ++i) {
    rows.select(0, i).lerp_(o.select(0, i).square().mean(-1), 1.0 - beta2);
  }
  const at::Tensor hat = o / (rows.sqrt() + epsilon).unsqueeze(-1);
  std::vector<at::Tensor> o_norms, hat_norms;
  for (int64_t i = 0; i < o.size(0); ++i) {
    o_norms.push_back(at::linalg_vector_norm(o.select(0, i)));
    hat_norms.push_back(at::linalg_vector_norm(hat.select(0, i)));
  }
  const at::Tensor ratio = at::stack(o_norms) / (at::stack(hat_norms) + epsilon);
  return (hat * ratio.view({-1, 1, 1})).view(orthogonalized.sizes());
}

at::Tensor cautious_decay_mask(const at::Tensor& update, const at::Tensor& param) {
  return (update.sign() * param.sign()).ge(0);
}

}  // namespace mixtrain
