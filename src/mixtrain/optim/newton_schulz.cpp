#include "mixtrain/optim/newton_schulz.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

#include "mixtrain/core/cpu_gemm.h"

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

// Polar Express (arXiv 2505.16932). Compared, all agreeing: the paper's Algorithm 1 (the eight
// triples below, before safety) and its repository NoahAmsel/PolarExpress (polar_express/basic.py,
// the same numbers, same safety, input norm times 1.01); NVIDIA-NeMo/Emerging-Optimizers
// muon_utils.py (these divided by the safety, cut to 4 decimals: within 1e-4); and our own
// re-derivation from the paper's Sections 4.2-4.4 / Appendix G (equioscillating quintic on
// [max(l, cushion u), u], recentred; l <- p(l), u <- 2 - l; l_1 = 1e-3, cushion 0.02407...):
// within 5e-9 relative (the last two, which the paper rounds to 15/8, -10/8, 3/8).
constexpr double kPolarExpress8Safety = 0.01;
constexpr std::array<NsCoefficients, 8> kPolarExpress8BeforeSafety = {{
    {8.28721201814563, -23.595886519098837, 17.300387312530933},
    {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
    {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
    {3.3184196573706015, -2.488488024314874, 0.51004894012372},
    {2.300652019954817, -1.6689039845747493, 0.4188073119525673},
    {1.891301407787398, -1.2679958271945868, 0.37680408948524835},
    {1.8750014808534479, -1.2500016453999487, 0.3750001645474248},
    {1.875, -1.25, 0.375},
}};
// The five-step set, safety 1.02 already folded into all but the last triple (input norm times
// 1.02). Compared: modded-nanogpt train_gpt.py and microsoft/dion benchmark/polar_express.py
// (the same digits), and our re-derivation with the paper's algorithm for num_iters 5 (l_1 =
// 1e-3, cushion 0.02, each polynomial but the last p(x) -> p(x / 1.02) before l <- p(l)):
// within 4e-15 relative.
constexpr double kPolarExpress5Safety = 0.02;
constexpr std::array<NsCoefficients, 5> kPolarExpress5 = {{
    {8.156554524902461, -22.48329292557795, 15.878769915207462},
    {4.042929935166739, -2.808917465908714, 0.5000178451051316},
    {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
    {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
    {2.3465413258596377, -1.7097828382687081, 0.42323551169305323},
}};

void check_polar_express_steps(int64_t ns_steps) {
  if (ns_steps != 5 && ns_steps != 8) {
    throw std::invalid_argument(
        "polar_express has published 5-step and 8-step sets; muon_ns_steps=" +
        std::to_string(ns_steps));
  }
}

// The iteration on [batch, rows, cols] matrices; returns [batch, rows, cols] in compute_dtype
// (a transposed view when rows > cols).
at::Tensor orthogonalize(const at::Tensor& matrices, const std::vector<NsCoefficients>& schedule,
                         double eps, c10::ScalarType compute_dtype, double norm_scale) {
  // m <= n, so X X^T is the small m x m Gram matrix.
  at::Tensor x = matrices.to(compute_dtype);
  const bool transposed = matrices.size(1) > matrices.size(2);
  if (transposed) x = x.transpose(1, 2);
  x = x.contiguous();

  // In compute_dtype, as the references do; eps only matters for an all-zero matrix.
  at::Tensor norm = at::linalg_vector_norm(x, 2, at::IntArrayRef({1, 2}), /*keepdim=*/true);
  if (norm_scale != 1.0) norm = norm * norm_scale;
  x = x / (norm + eps);

  for (const auto& [a, b, c] : schedule) {
    const at::Tensor gram = gemm::bmm(x, x.transpose(1, 2));
    // b A + c A A, then a X + (b A + c A A) X: one fused GEMM each, which also rounds once
    // instead of after every product and sum.
    const at::Tensor poly = gemm::baddbmm(gram, gram, gram, /*beta=*/b, /*alpha=*/c);
    x = gemm::baddbmm(x, poly, x, /*beta=*/a, /*alpha=*/1.0);
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
  if (variant == "asym5" || variant == "quintic") {
    if (steps > kAsym5.size()) {
      throw std::invalid_argument(
          variant + " has 5 coefficient sets; muon_ns_steps=" + std::to_string(ns_steps));
    }
    return std::vector<NsCoefficients>(kAsym5.begin(), kAsym5.begin() + ns_steps);
  }
  if (variant == "hybrid") {
    std::vector<NsCoefficients> schedule(steps, kHybridTail);
    for (int64_t i = 0; i < std::min(ns_steps, kHybridLegacySteps); ++i) schedule[i] = kLegacy;
    return schedule;
  }
  if (variant == "polar_express") {
    check_polar_express_steps(ns_steps);
    if (ns_steps == 5) return {kPolarExpress5.begin(), kPolarExpress5.end()};
    // p(x) -> p(x / s): a / s, b / s^3, c / s^5; not the last (it would leave the fixed point
    // at 1 / s instead of 1).
    const double s = 1.0 + kPolarExpress8Safety;
    std::vector<NsCoefficients> schedule(kPolarExpress8BeforeSafety.begin(),
                                         kPolarExpress8BeforeSafety.end());
    for (size_t i = 0; i + 1 < schedule.size(); ++i) {
      auto& [a, b, c] = schedule[i];
      a /= s;
      b /= s * s * s;
      c /= s * s * s * s * s;
    }
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
  throw std::invalid_argument(
      "unknown Newton-Schulz variant '" + variant +
      "' (expected legacy, asym5, quintic, hybrid, polar_express or custom)");
}

double newton_schulz_norm_scale(const std::string& variant, int64_t ns_steps) {
  if (variant != "polar_express") return 1.0;
  check_polar_express_steps(ns_steps);
  return 1.0 + (ns_steps == 5 ? kPolarExpress5Safety : kPolarExpress8Safety);
}

at::Tensor newton_schulz(const at::Tensor& g, const std::vector<NsCoefficients>& schedule,
                         double eps, c10::ScalarType compute_dtype, double norm_scale) {
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
    return orthogonalize(matrices, schedule, eps, compute_dtype, norm_scale)
        .reshape(g.sizes())
        .contiguous();
  }
  at::Tensor out = at::empty({batch, rows, cols}, g.options().dtype(compute_dtype));
  for (int64_t first = 0; first < batch; first += per_call) {
    const int64_t count = std::min(per_call, batch - first);
    out.narrow(0, first, count)
        .copy_(orthogonalize(matrices.narrow(0, first, count), schedule, eps, compute_dtype,
                             norm_scale));
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
