// causal_attention, both kernels, against a float64 reference written here from the formulas
// (explicit per-head loop, softmax and its backward by hand): float32, bfloat16 and float16
// inputs, grouped-query and plain multi-head, odd sequence lengths, moderate and large scores;
// the output and the gradients of q, k and v, each within an error bound derived below from where
// the kernel rounds. Also: the same bits across thread counts and batch composition, repeat_kv.
#include "mixtrain/model/attention.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

struct Shape {
  int64_t batch, heads, kv_heads, seq, head_dim;
};

struct Inputs {
  torch::Tensor q, k, v, dout;  // in the compute dtype
};

// q, k ~ N(0, score_scale^2) (scores ~ N(0, score_scale^4)), v, dout ~ N(0, 1), rounded to dtype.
// q, k and v are transposed views of [B, S, heads, D] tensors, the layout the model passes.
Inputs make_inputs(const Shape& s, torch::ScalarType dtype, double score_scale, uint64_t seed) {
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

Result run(AttentionKernel kernel, const Inputs& in) {
  const auto q = in.q.detach().requires_grad_(), k = in.k.detach().requires_grad_(),
             v = in.v.detach().requires_grad_();
  const auto out = causal_attention(q, k, v, kernel);
  if (kernel == AttentionKernel::kFlash) {
    // at::scaled_dot_product_attention may fall back to its math backend; this must not.
    EXPECT_NE(out.grad_fn()->name().find("FlashAttention"), std::string::npos)
        << out.grad_fn()->name();
  }
  out.backward(in.dout);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

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

Reference reference_attention(const Inputs& in) {
  const auto q = in.q.to(torch::kFloat64), k = in.k.to(torch::kFloat64),
             v = in.v.to(torch::kFloat64), dout = in.dout.to(torch::kFloat64);
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), dim = q.size(3);
  const int64_t groups = heads / k.size(1);
  const double scale = 1.0 / std::sqrt(double(dim));
  const auto future = torch::ones({seq, seq}, torch::kBool).triu(1);
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

Roundings roundings_of(AttentionKernel kernel, const Shape& s) {
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
Tolerance tolerance_of(AttentionKernel kernel, const Shape& s, double u, double sigma) {
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

double unit_roundoff(torch::ScalarType dtype) {
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
double error(const torch::Tensor& x, const torch::Tensor& ref, const torch::Tensor& magnitude) {
  return (x.to(torch::kFloat64) - ref).abs().max().item<double>() / magnitude.max().item<double>();
}

const std::vector<Shape> kShapes = {
    {2, 4, 2, 33, 16},  // head_dim and groups of configs/qwen2_moe_tiny.yaml, odd length
    {1, 6, 2, 77, 64},  // of bench_train_throughput's 41M config; three query blocks of 32
    {2, 3, 3, 5, 8},    // plain multi-head, head_dim with an irrational sqrt
};

class AttentionAccuracy : public ::testing::TestWithParam<torch::ScalarType> {};

TEST_P(AttentionAccuracy, BothKernelsMatchTheFloat64ReferenceWithinTheirBounds) {
  const auto dtype = GetParam();
  const double u = unit_roundoff(dtype);
  uint64_t seed = 1;
  for (const Shape& shape : kShapes) {
    // Scores ~ N(0, 1) and ~ N(0, 81): trained models reach both.
    for (double score_scale : {1.0, 3.0}) {
      const Inputs in = make_inputs(shape, dtype, score_scale, seed++);
      const Reference ref = reference_attention(in);
      ASSERT_GT(ref.value.out.abs().max().item<double>(), 0.1);  // not a vacuous comparison
      for (AttentionKernel kernel : {AttentionKernel::kMath, AttentionKernel::kFlash}) {
        const Result got = run(kernel, in);
        ASSERT_EQ(got.out.scalar_type(), dtype);
        ASSERT_EQ(got.out.sizes(), ref.value.out.sizes());
        const Tolerance tol = tolerance_of(kernel, shape, u, ref.sigma);
        const double e_out = error(got.out, ref.value.out, ref.magnitude.out);
        const double e_dq = error(got.dq, ref.value.dq, ref.magnitude.dq);
        const double e_dk = error(got.dk, ref.value.dk, ref.magnitude.dk);
        const double e_dv = error(got.dv, ref.value.dv, ref.magnitude.dv);
        const std::string where = std::string(attention_kernel_name(kernel)) + " " +
                                  c10::toString(dtype) + " S=" + std::to_string(shape.seq) +
                                  " D=" + std::to_string(shape.head_dim) + " scores x" +
                                  std::to_string(int(score_scale * score_scale));
        // In units of u: the measured error and its bound, for bench/README.md's comparison.
        std::printf(
            "%-40s sigma %5.1f  out %6.2f (%6.1f)  dq %6.2f (%6.1f)  dk %6.2f (%6.1f)  "
            "dv %6.2f (%6.1f)\n",
            where.c_str(), ref.sigma, e_out / u, tol.out / u, e_dq / u, tol.dq / u, e_dk / u,
            tol.dk / u, e_dv / u, tol.dv / u);
        EXPECT_LE(e_out, tol.out) << where;
        EXPECT_LE(e_dq, tol.dq) << where;
        EXPECT_LE(e_dk, tol.dk) << where;
        EXPECT_LE(e_dv, tol.dv) << where;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionAccuracy,
                         ::testing::Values(torch::kFloat32, torch::kBFloat16, torch::kHalf),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

// The distributed tests compare runs whose ranks see other batch sizes (and may use other thread
// counts) than the single process: the same bits regardless. One exception, of the math kernel in
// float32: its backward GEMMs (MKL sgemm) split their sums by the thread count, so dQ and dK
// differ in the last bits between 1 and 3 threads (measured); the flash kernel parallelizes over
// (batch, head, query block) only.
TEST(Attention, BitIdenticalAcrossThreadCountsAndBatchComposition) {
  const Shape shape{3, 6, 2, 45, 16};
  const int threads = at::get_num_threads();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const Inputs in = make_inputs(shape, dtype, 2.0, 7);
    for (AttentionKernel kernel : {AttentionKernel::kMath, AttentionKernel::kFlash}) {
      const std::string where =
          std::string(attention_kernel_name(kernel)) + " " + c10::toString(dtype);
      const bool thread_invariant = !(kernel == AttentionKernel::kMath && dtype == torch::kFloat32);
      at::set_num_threads(1);
      const Result one = run(kernel, in);
      at::set_num_threads(3);
      const Result three = run(kernel, in);
      at::set_num_threads(threads);
      Inputs middle;  // sequence 1 of the batch on its own
      middle.q = in.q.narrow(0, 1, 1);
      middle.k = in.k.narrow(0, 1, 1);
      middle.v = in.v.narrow(0, 1, 1);
      middle.dout = in.dout.narrow(0, 1, 1);
      const Result alone = run(kernel, middle);
      for (auto [a, b, c] :
           {std::tuple{one.out, three.out, alone.out}, std::tuple{one.dq, three.dq, alone.dq},
            std::tuple{one.dk, three.dk, alone.dk}, std::tuple{one.dv, three.dv, alone.dv}}) {
        if (thread_invariant) {
          EXPECT_TRUE(torch::equal(a, b)) << where << ": 1 vs 3 threads";
        }
        EXPECT_TRUE(torch::equal(a.narrow(0, 1, 1), c)) << where << ": alone vs in the batch";
      }
    }
  }
}

TEST(Attention, TheModelsKernelIsFlashInFloat32Only) {
  EXPECT_EQ(attention_kernel_for(torch::kFloat32), AttentionKernel::kFlash);
  EXPECT_EQ(attention_kernel_for(torch::kBFloat16), AttentionKernel::kMath);
  EXPECT_EQ(attention_kernel_for(torch::kHalf), AttentionKernel::kMath);
}

TEST(Attention, KernelNamesAndShapeChecks) {
  EXPECT_STREQ(attention_kernel_name(AttentionKernel::kMath), "math");
  EXPECT_STREQ(attention_kernel_name(AttentionKernel::kFlash), "flash");
  const auto q = torch::zeros({1, 4, 3, 8}), kv = torch::zeros({1, 3, 3, 8});
  EXPECT_THROW(causal_attention(q, kv, kv, AttentionKernel::kMath), c10::Error);  // 3 !| 4
  EXPECT_THROW(causal_attention(q, q.narrow(2, 0, 2), q.narrow(2, 0, 2), AttentionKernel::kFlash),
               c10::Error);  // k shorter than q: not self-attention
}

TEST(AttentionGqa, RepeatKvMapsQueryHeadToKvHeadDividedByGroupSize) {
  const auto kv = torch::arange(2 * 3 * 5 * 4, torch::kFloat32).view({2, 3, 5, 4});
  const auto rep = repeat_kv(kv, 2);
  ASSERT_EQ(rep.sizes().vec(), (std::vector<int64_t>{2, 6, 5, 4}));
  for (int64_t h = 0; h < 6; ++h) {
    EXPECT_TRUE(torch::equal(rep.select(1, h), kv.select(1, h / 2))) << h;
  }
  EXPECT_TRUE(torch::equal(repeat_kv(kv, 1), kv));
}

// QK-clip's statistic against loops written here in float64: head h, max over b and the allowed
// (i, j) of sum_d q[b,h,i,d] k[b,h/n,j,d] / sqrt(D).
std::vector<double> reference_max_logits(const torch::Tensor& q, const torch::Tensor& k,
                                         const std::vector<int64_t>& q_pos,
                                         const std::vector<int64_t>& k_pos) {
  const auto qa = q.to(torch::kDouble).contiguous(), ka = k.to(torch::kDouble).contiguous();
  const auto qd = qa.accessor<double, 4>(), kd = ka.accessor<double, 4>();
  const int64_t group = q.size(1) / k.size(1), dim = q.size(3);
  std::vector<double> result(q.size(1), -std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < q.size(0); ++b) {
    for (int64_t h = 0; h < q.size(1); ++h) {
      for (int64_t i = 0; i < q.size(2); ++i) {
        for (int64_t j = 0; j < k.size(2); ++j) {
          if (k_pos[j] > q_pos[i]) continue;  // the future: masked
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += qd[b][h][i][d] * kd[b][h / group][j][d];
          result[h] = std::max(result[h], dot / std::sqrt(double(dim)));
        }
      }
    }
  }
  return result;
}

TEST(AttentionMaxLogits, PerHeadCausalMaxMatchesTheLoopsGqaAndPositions) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto q = torch::randn({2, 4, 6, 8}, gen) * 2, k = torch::randn({2, 2, 6, 8}, gen) * 2;
  // A huge logit in the future of query 0 (key 5 = 50 q_0, head 0): it must not count.
  k.select(2, 5).select(1, 0).copy_(q.select(2, 0).select(1, 0) * 50);
  std::vector<int64_t> pos = {0, 1, 2, 3, 4, 5};
  const auto expected = reference_max_logits(q, k, pos, pos);
  const auto got = causal_max_logits(q, k);
  ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{4}));
  EXPECT_EQ(got.scalar_type(), torch::kFloat32);
  // float32 dot products of 8 terms of size ~4 (|sum| <= ~60): a few ulp of 60, ~1e-5; 1e-4.
  for (int64_t h = 0; h < 4; ++h) EXPECT_NEAR(got[h].item<double>(), expected[h], 1e-4) << h;
  // The masked entry is far above every allowed one: a mask that leaked would show.
  const auto unmasked = (torch::matmul(q, repeat_kv(k, 2).transpose(2, 3)) / std::sqrt(8.0));
  EXPECT_GT(unmasked.select(1, 0).max().item<double>(), expected[0] + 100);

  // Context parallelism's layout: this rank's queries at positions {2, 3, 8, 9} of 12 over all
  // 12 keys, in another order (rank-major), and blocks of one query row (a long sequence).
  const auto q_all = torch::randn({1, 2, 12, 4}, gen), k_all = torch::randn({1, 1, 12, 4}, gen);
  const std::vector<int64_t> q_rows = {2, 3, 8, 9}, k_rows = {0, 1, 10, 11, 2, 3, 8, 9, 4, 5, 6, 7};
  const auto q_local = q_all.index_select(2, torch::tensor(q_rows));
  const auto k_perm = k_all.index_select(2, torch::tensor(k_rows));
  const auto expected_cp = reference_max_logits(q_local, k_perm, q_rows, k_rows);
  const auto got_cp =
      causal_max_logits(q_local, k_perm, torch::tensor(q_rows), torch::tensor(k_rows));
  for (int64_t h = 0; h < 2; ++h) EXPECT_NEAR(got_cp[h].item<double>(), expected_cp[h], 1e-5) << h;
  EXPECT_THROW(causal_max_logits(q, k, torch::tensor(q_rows)), c10::Error);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
