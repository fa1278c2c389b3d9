// The float64 reference of causal grouped-query attention and the error bounds of its two
// kernels, derived from where each rounds (tests/unit/model/attention_test.cpp checks LibTorch's
// CPU kernels against them, attention_cuda_test.cpp the CUDA ones): written from the formulas,
// an explicit per-head loop, softmax and its backward by hand.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "mixtrain/model/attention.h"

namespace mixtrain::test_support {

struct Shape {
  int64_t batch, heads, kv_heads, seq, head_dim;
};

struct Inputs {
  torch::Tensor q, k, v, dout;  // in the compute dtype
};

// q, k ~ N(0, score_scale^2) (scores ~ N(0, score_scale^4)), v, dout ~ N(0, 1), rounded to dtype.
// q, k and v are transposed views of [B, S, heads, D] tensors, the layout the model passes.
inline Inputs make_inputs(const Shape& s, torch::ScalarType dtype, double score_scale,
                          uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto draw = [&](int64_t heads, double scale) {
    return (torch::randn({s.batch, s.seq, heads, s.head_dim}, gen) * scale)
        .to(dtype)
        .transpose(1, 2);
  };
  Inputs in;
  in.q = draw(s.heads, score_scale);
  in.k = draw(s.kv_heads, score_scale);
  in.v = draw(s.kv_heads, 1.0);
  in.dout = draw(s.heads, 1.0).contiguous();
  return in;
}

struct Result {
  torch::Tensor out, dq, dk, dv;
};

// float64, from the formulas. Besides the values, the magnitudes the rounding errors scale with:
//   P = softmax of the allowed scores s_ij = scale q_i.k_j (j <= i), D_ij = sum_d |dO_id||v_jd|,
//   Delta_i = sum_j P_ij D_ij, W = P (D + Delta) (elementwise; |dS| <= W since |dP| <= D and
//   |delta| <= Delta), and
//   n_out = P|V|, n_dv = sum over the group of P^T|dO|, n_dq = scale W|K|, n_dk = scale sum W^T|Q|,
//   sigma = max over allowed (i, j) of scale sum_d |q_id||k_jd| (>= every |s_ij|).
struct Reference {
  Result value, magnitude;
  double sigma = 0;
};

// window > 0: sliding-window attention, keys j with i - window < j <= i (HF Mistral's mask).
inline Reference reference_attention(const Inputs& in, int64_t window = 0) {
  const auto q = in.q.to(torch::kFloat64), k = in.k.to(torch::kFloat64),
             v = in.v.to(torch::kFloat64), dout = in.dout.to(torch::kFloat64);
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), dim = q.size(3);
  const int64_t groups = heads / k.size(1);
  const double scale = 1.0 / std::sqrt(double(dim));
  auto future = torch::ones({seq, seq}, torch::kBool).triu(1);
  if (window > 0) future = future.logical_or(torch::ones({seq, seq}, torch::kBool).tril(-window));
  Reference r;
  for (auto* t : {&r.value, &r.magnitude}) {
    t->out = torch::zeros_like(q);
    t->dq = torch::zeros_like(q);
    t->dk = torch::zeros_like(k);
    t->dv = torch::zeros_like(v);
  }
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / groups;  // the kv head query head h reads
      const auto Q = q[b][h], K = k[b][g], V = v[b][g], dO = dout[b][h];
      const auto s =
          (Q.matmul(K.t()) * scale).masked_fill(future, -std::numeric_limits<double>::infinity());
      const auto e = (s - std::get<0>(s.max(1, true))).exp();  // exp(-inf) = 0: masked keys
      const auto P = e / e.sum(1, true);
      const auto dP = dO.matmul(V.t());
      const auto dS = P * (dP - (P * dP).sum(1, true));
      r.value.out[b][h] = P.matmul(V);
      r.value.dq[b][h] = scale * dS.matmul(K);
      r.value.dk[b][g] += scale * dS.t().matmul(Q);
      r.value.dv[b][g] += P.t().matmul(dO);

      const auto D = dO.abs().matmul(V.abs().t());
      const auto W = P * (D + (P * D).sum(1, true));
      r.magnitude.out[b][h] = P.matmul(V.abs());
      r.magnitude.dq[b][h] = scale * W.matmul(K.abs());
      r.magnitude.dk[b][g] += scale * W.t().matmul(Q.abs());
      r.magnitude.dv[b][g] += P.t().matmul(dO.abs());
      r.sigma = std::max(
          r.sigma,
          (scale * Q.abs().matmul(K.abs().t())).masked_fill(future, 0.0).max().item<double>());
    }
  }
  return r;
}

// The error bound. u: unit roundoff of the compute dtype T (float32 2^-24, bfloat16 2^-8, float16
// 2^-11); eps = 2^-24: both kernels accumulate every GEMM and the softmax in float32. A kernel is
// described by how often it rounds each intermediate to T:
struct Roundings {
  int scores;  // each score before the softmax
  int dp;      // dP = dO V^T
  int ds;      // dS before the dQ and dK GEMMs
  int dq;      // dQ, with every partial sum accumulated in T
  int dkv;     // dK and dV, likewise
};

inline Roundings roundings_of(AttentionKernel kernel, const Shape& s) {
  if (kernel == AttentionKernel::kMath) {
    // Q K^T and its division by sqrt(D) in T; dP (a GEMM in T); dS as the softmax backward's
    // cast to T and again divided by sqrt(D); dQ one GEMM; dK and dV one GEMM per query head,
    // then repeat_kv's backward sums the group in T.
    return {2, 1, 2, 1, 2};
  }
  // LibTorch 2.x FlashAttentionKernel.cpp: scores and dP in float32; dS rounded to T as a GEMM
  // operand; the backward adds into the T-typed gradients block by block (beta = 1): dQ once per
  // 512 keys, dK and dV once per 32 queries (sequences under 192) and per head of the group, at
  // most one more rounding if the group is summed afterwards.
  const auto blocks = [](int64_t n, int64_t block) { return int((n + block - 1) / block); };
  return {0, 0, 1, blocks(s.seq, 512), int(s.heads / s.kv_heads) * blocks(s.seq, 32) + 1};
}

struct Tolerance {
  double out, dq, dk, dv;
};

// First-order propagation, each term relative to Reference's magnitudes (Higham: a GEMM of n
// terms accumulated in float32 is off by <= n eps |A||B|; a rounding to T by <= u |x|):
//   scores, absolute:  e_s = (scores u + (D + 1) eps) sigma
//   P, relative:       e_P = 2 e_s + u + 2 (2 sigma + S + 4) eps
//     (the softmax moves log P by <= 2 e_s; P is rounded to T as a GEMM operand; float32
//     x - max, exp, a sum of S, the division; doubled for flash's recomputation from the
//     logsumexp)
//   out = P V:         e_P + u + S eps   (rounded once)
//   dV:                e_P + dkv u + G S eps   (a sum over G heads x S queries)
//   delta_i:           e_d = max(e_P + dp u, out's bound) + (D + S) eps
//     (math: sum_j P_ij dP_ij; flash: dO_i . out_i with out rounded as above)
//   dS = P (dP - delta), relative to W: e_dS = e_P + (dp + ds) u + D eps + e_d
//   dQ:                e_dS + dq u + (S + 1) eps;   dK: e_dS + dkv u + (G S + 1) eps
// Worst cases (every rounding error of one sign, every score at sigma): the measured errors are
// below them by 3x (flash's output) and more. A wrong mask, scale, head mapping or dtype is off
// by O(1) and fails them.
inline Tolerance tolerance_of(AttentionKernel kernel, const Shape& s, double u, double sigma) {
  const double eps = std::ldexp(1.0, -24);
  const Roundings r = roundings_of(kernel, s);
  const double S = double(s.seq), D = double(s.head_dim), G = double(s.heads / s.kv_heads);
  const double e_s = (r.scores * u + (D + 1) * eps) * sigma;
  const double e_p = 2 * e_s + u + 2 * (2 * sigma + S + 4) * eps;
  Tolerance t;
  t.out = e_p + u + S * eps;
  t.dv = e_p + r.dkv * u + G * S * eps;
  const double e_delta = std::max(e_p + r.dp * u, t.out) + (D + S) * eps;
  const double e_ds = e_p + (r.dp + r.ds) * u + D * eps + e_delta;
  t.dq = e_ds + r.dq * u + (S + 1) * eps;
  t.dk = e_ds + r.dkv * u + (G * S + 1) * eps;
  return t;
}

inline double unit_roundoff(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16:
      return std::ldexp(1.0, -8);
    case torch::kHalf:
      return std::ldexp(1.0, -11);
    default:
      return std::ldexp(1.0, -24);
  }
}

// max |x - ref| / max magnitude.
inline double error(const torch::Tensor& x, const torch::Tensor& ref,
                    const torch::Tensor& magnitude) {
  return (x.to(torch::kFloat64) - ref).abs().max().item<double>() / magnitude.max().item<double>();
}

}  // namespace mixtrain::test_support
