// A scalar AdamW reference for the CUDA tests: the per-element float operations
// optim/kernels/adamw_kernel.h documents for the AVX2 / AVX-512 kernels (lerp_ and addcmul_ as
// one fused multiply-add each, every other operation rounded once), with the correctly rounded
// square root of std::sqrt, written independently of the kernels from adamw.h's op sequence.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "mixtrain/optim/kernels/adamw_kernel.h"

namespace mixtrain::testing {

// x rounded to float here: a volatile store keeps GCC from contracting a product and a sum
// into one fused multiply-add (its default -ffp-contract=fast does where the target has FMA).
inline float rounded(float x) {
  volatile float stored = x;
  return stored;
}

// The float scalars torch/optim/adamw.py's double arithmetic gives for `step` (1-based).
inline AdamWStepScalars reference_scalars(double lr, double beta1, double beta2, double eps,
                                          double weight_decay, int64_t step) {
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  AdamWStepScalars s;
  s.decay = static_cast<float>(1 - lr * weight_decay);
  s.exp_avg_weight = static_cast<float>(1 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(eps);
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  return s;
}

// The moment updates of one element, in place.
inline void reference_moments(const AdamWStepScalars& s, float g, float& m, float& v) {
  // exp_avg.lerp_(g, w): ATen's two formulas, each ending in one fused multiply-add
  const float w = s.exp_avg_weight;
  const float diff = rounded(g - m);
  m = std::fabs(w) < 0.5f ? std::fma(w, diff, m) : std::fma(-diff, rounded(1.f - w), g);
  // exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2)
  v = std::fma(rounded(s.one_minus_beta2 * g), g, rounded(v * s.beta2));
}

// The new param of one element from the updated exp_avg m and root = sqrt(updated exp_avg_sq).
inline float reference_param(const AdamWStepScalars& s, float p, float m, float root) {
  // p.mul_(decay); denom = sqrt(v) / sqrt(bc2) + eps; p.addcdiv_(m, denom, -step_size)
  const float decayed = rounded(p * s.decay);
  const float denom = rounded(rounded(root / s.bias_correction2_sqrt) + s.eps);
  return rounded(decayed + rounded(rounded(s.neg_step_size * m) / denom));
}

// One element of the step, in place, with the correctly rounded square root.
inline void reference_element(const AdamWStepScalars& s, float& p, float g, float& m, float& v) {
  reference_moments(s, g, m, v);
  p = reference_param(s, p, m, std::sqrt(v));
}

// Round to nearest even into the 16-bit model dtype, as Tensor::to gives (c10's conversions).
inline uint16_t reference_model_bits(float x, bool bfloat16) {
  uint16_t bits;
  if (bfloat16) {
    const c10::BFloat16 b(x);
    std::memcpy(&bits, &b, 2);
  } else {
    const c10::Half h(x);
    std::memcpy(&bits, &h, 2);
  }
  return bits;
}

}  // namespace mixtrain::testing
