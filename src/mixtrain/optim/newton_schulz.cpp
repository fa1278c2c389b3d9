#include "mixtrain/optim/newton_schulz.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

#include "mixtrain/config/trainer_config.h"  // kHybridLegacySteps

namespace mixtrain {
namespace {

constexpr NsCoefficients kLegacy = {3.4445, -4.7750, 2.0315};
// Quintic with p(1) = 1 and p'(1) = 0: polishes the legacy band towards 1 (DeepSeek-V4).
constexpr NsCoefficients kHybridTail = {2.0, -1.5, 0.5};
constexpr std::array<NsCoefficients, 5> kAsym5 = {{
    {4.0848, -6.8946, 2.9270},
    {3.9505, -6.3029, 2.6377},
    {3.7418, -5.5913, 2.3037},
    {2.8769, -3.1427, 1.2046},
    {2.8366, -3.0525, 1.2012},
}};

// The iteration on [batch, rows, cols] matrices; returns [batch, rows, cols] in compute_dtype
// (a transposed view when rows > cols).
at::Tensor orthogonalize(const at::Tensor& matrices, const std::vector<NsCoefficients>& schedule,
                         double eps, c10::ScalarType compute_dtype) {
  // m <= n, so X X^T is the small m x m Gram matrix.
  at::Tensor x = matrices.to(compute_dtype);
  const bool transposed = matrices.size(1) > matrices.size(2);
  if (transposed) x = x.transpose(1, 2);
  x = x.contiguous();

  // In compute_dtype, as the references do; eps only matters for an all-zero matrix.
  at::Tensor norm = at::linalg_vector_norm(x, 2, at::IntArrayRef({1, 2}), /*keepdim=*/true);
  x = x / (norm + eps);

  for (const auto& [a, b, c] : schedule) {
    const at::Tensor gram = at::bmm(x, x.transpose(1, 2));
    // b A + c A A, then a X + (b A + c A A) X: one fused GEMM each, which also rounds once
    // instead of after every product and sum.
    const at::Tensor poly = at::baddbmm(gram, gram, gram, /*beta=*/b, /*alpha=*/c);
    x = at::baddbmm(x, poly, x, /*beta=*/a, /*alpha=*/1.0);
  }
  return transposed ? x.transpose(1, 2) : x;
}

}  // namespace

std::vector<NsCoefficients> newton_schulz_schedule(const std::string& variant, int64_t ns_steps,
                                                   const std::vector<NsCoefficients>& custom) {
  if (ns_steps < 1) {
    throw std::invalid_argument("muon_ns_steps must be >= 1; muon_ns_steps=" +
                                std::to_string(ns_steps));
  }
  const auto steps = static_cast<size_t>(ns_steps);
  if (variant == "legacy") return std::vector<NsCoefficients>(steps, kLegacy);
  if (variant == "asym5") {
    if (steps > kAsym5.size()) {
      throw std::invalid_argument("asym5 has 5 coefficient sets; muon_ns_steps=" +
                                  std::to_string(ns_steps));
    }
    return std::vector<NsCoefficients>(kAsym5.begin(), kAsym5.begin() + ns_steps);
  }
  if (variant == "hybrid") {
    std::vector<NsCoefficients> schedule(steps, kHybridTail);
    for (int64_t i = 0; i < std::min(ns_steps, kHybridLegacySteps); ++i) schedule[i] = kLegacy;
    return schedule;
  }
  if (variant == "custom") {
    if (custom.size() != steps) {
      throw std::invalid_argument("custom Newton-Schulz schedule has " +
                                  std::to_string(custom.size()) +
                                  " coefficient sets; muon_ns_steps=" + std::to_string(ns_steps));
    }
    return custom;
  }
  throw std::invalid_argument("unknown Newton-Schulz variant '" + variant +
                              "' (expected legacy, asym5, hybrid or custom)");
}

at::Tensor newton_schulz(const at::Tensor& g, const std::vector<NsCoefficients>& schedule,
                         double eps, c10::ScalarType compute_dtype) {
  if (g.dim() < 2) {
    throw std::invalid_argument("newton_schulz needs a tensor of at least 2 dims, got shape " +
                                c10::str(g.sizes()));
  }
  if (compute_dtype != at::kBFloat16 && compute_dtype != at::kFloat &&
      compute_dtype != at::kDouble) {
    throw std::invalid_argument("newton_schulz computes in bfloat16, float32 or float64, not " +
                                std::string(c10::toString(compute_dtype)));
  }
  const int64_t rows = g.size(-2);
  const int64_t cols = g.size(-1);
  if (g.numel() == 0) return at::zeros(g.sizes(), g.options().dtype(compute_dtype));

  const at::Tensor matrices = g.reshape({-1, rows, cols});
  const int64_t batch = matrices.size(0);
  const int64_t per_call =
      newton_schulz_matrices_per_call(rows, cols, compute_dtype, g.device().type());
  if (batch <= per_call) {
    return orthogonalize(matrices, schedule, eps, compute_dtype).reshape(g.sizes()).contiguous();
  }
  at::Tensor out = at::empty({batch, rows, cols}, g.options().dtype(compute_dtype));
  for (int64_t first = 0; first < batch; first += per_call) {
    const int64_t count = std::min(per_call, batch - first);
    out.narrow(0, first, count)
        .copy_(orthogonalize(matrices.narrow(0, first, count), schedule, eps, compute_dtype));
  }
  return out.view(g.sizes());
}

int64_t newton_schulz_matrices_per_call(int64_t rows, int64_t cols, c10::ScalarType dtype,
                                        c10::DeviceType device) {
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  const int64_t matrix_bytes =
      std::max<int64_t>(1, std::max(m * n, m * m) * static_cast<int64_t>(c10::elementSize(dtype)));
  const int64_t call_bytes =
      device == c10::DeviceType::CUDA ? kNewtonSchulzBytesPerCallCuda : kNewtonSchulzBytesPerCall;
  return std::max<int64_t>(1, call_bytes / matrix_bytes);
}

}  // namespace mixtrain
