#include "mixtrain/model/attention.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "mixtrain/core/cpu_gemm.h"
#include "mixtrain/core/host_sync.h"

namespace mixtrain {

const char* attention_kernel_name(AttentionKernel kernel) {
  return kernel == AttentionKernel::kFlash ? "flash" : "math";
}

AttentionKernel attention_kernel_for(c10::ScalarType dtype, c10::Device device) {
  if (device.is_cuda()) return AttentionKernel::kFlash;
  return dtype == at::kFloat ? AttentionKernel::kFlash : AttentionKernel::kMath;
}

torch::Tensor attention_on_gemm_path(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const AttendFn& attend) {
  if (!widens_gemm(q)) return attend(q, k, v, attention_kernel_for(q.scalar_type(), q.device()));
  const auto wide = [](const torch::Tensor& t) { return t.to(at::kFloat); };
  const AttentionKernel kernel = attention_kernel_for(at::kFloat, q.device());
  return attend(wide(q), wide(k), wide(v), kernel).to(q.scalar_type());
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, AttentionKernel kernel, int64_t window) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "causal_attention: q, k, v must be [batch, heads, seq, head_dim]");
  TORCH_CHECK(k.sizes() == v.sizes() && q.size(0) == k.size(0) && q.size(2) == k.size(2) &&
                  q.size(3) == k.size(3) && q.size(1) % k.size(1) == 0,
              "causal_attention: q ", q.sizes(), " and k/v ", k.sizes(), " ", v.sizes(),
              " do not fit (kv heads must divide query heads)");
  TORCH_CHECK(window >= 0, "causal_attention: window must be >= 0, got ", window);
  const int64_t head_dim = q.size(3), seq = q.size(2);
  // Hidden pairs: the future, and with a window the keys window or more positions back.
  const auto ones = at::ones({seq, seq}, q.options().dtype(at::kBool));
  auto hidden = ones.triu(1);
  const bool banded = window > 0 && window < seq;
  if (banded) hidden = hidden.logical_or(ones.tril(-window));
  if (kernel == AttentionKernel::kFlash) {
    const double scale = 1.0 / std::sqrt(double(head_dim));
    if (banded) {
      return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/hidden.logical_not(),
                                              /*dropout_p=*/0.0, /*is_causal=*/false, scale,
                                              /*enable_gqa=*/true);
    }
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, scale, /*enable_gqa=*/true);
  }
  const int64_t groups = q.size(1) / k.size(1);
  const auto key = repeat_kv(k, groups), value = repeat_kv(v, groups);
  auto weights = gemm::matmul(q, key.transpose(2, 3)) / std::sqrt(double(head_dim));
  weights = weights.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  // Upcast for the softmax, as HF: bf16 exp/sum over the keys loses too much.
  weights = at::softmax(weights, -1, at::kFloat).to(q.scalar_type());
  return gemm::matmul(weights, value);
}

torch::Tensor causal_max_logits(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& q_positions, const torch::Tensor& k_positions,
                                int64_t window) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(0) == k.size(0) && q.size(3) == k.size(3) &&
                  q.size(1) % k.size(1) == 0,
              "causal_max_logits: q ", q.sizes(), " and k ", k.sizes(), " do not fit");
  at::NoGradGuard no_grad;
  const int64_t batch = q.size(0), heads = q.size(1), q_len = q.size(2), k_len = k.size(2);
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(q.device());
  const at::Tensor q_pos = q_positions.defined()
                               ? copy_to_device(q_positions, q.device(), "attention: positions")
                               : at::arange(q_len, long_options);
  const at::Tensor k_pos = k_positions.defined()
                               ? copy_to_device(k_positions, q.device(), "attention: positions")
                               : at::arange(k_len, long_options);
  TORCH_CHECK(q_pos.numel() == q_len && k_pos.numel() == k_len,
              "causal_max_logits: positions do not match the sequence lengths");
  const at::Tensor key = repeat_kv(k.to(at::kFloat), heads / k.size(1)).transpose(2, 3);
  const double scale = 1.0 / std::sqrt(double(q.size(3)));
  const int64_t rows =
      std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(1, batch * heads * k_len));
  at::Tensor result =
      at::full({heads}, -std::numeric_limits<float>::infinity(), q.options().dtype(at::kFloat));
  for (int64_t start = 0; start < q_len; start += rows) {
    const int64_t n = std::min(rows, q_len - start);
    at::Tensor scores = at::matmul(q.narrow(2, start, n).to(at::kFloat), key) * scale;
    const at::Tensor q_rows = q_pos.narrow(0, start, n).unsqueeze(1);
    at::Tensor hidden = k_pos.unsqueeze(0) > q_rows;
    if (window > 0) hidden = hidden.logical_or(k_pos.unsqueeze(0) <= q_rows - window);
    scores.masked_fill_(hidden, -std::numeric_limits<float>::infinity());
    result = at::maximum(result, scores.amax({0, 2, 3}));
  }
  return result;
}

torch::Tensor repeat_kv(const torch::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t batch = x.size(0), kv_heads = x.size(1), seq = x.size(2), dim = x.size(3);
  return x.unsqueeze(2)
      .expand({batch, kv_heads, n_rep, seq, dim})
      .reshape({batch, kv_heads * n_rep, seq, dim});
}

}  // namespace mixtrain
