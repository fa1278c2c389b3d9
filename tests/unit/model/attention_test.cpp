// causal_attention, both kernels, against a float64 reference written from the formulas
// (support/attention_reference.h: explicit per-head loop, softmax and its backward by hand, and
// each kernel's error bound derived from where it rounds): float32, bfloat16 and float16
// inputs, grouped-query and plain multi-head, odd sequence lengths, moderate and large scores;
// the output and the gradients of q, k and v, each within its bound. Also: the same bits across
// thread counts and batch composition, repeat_kv, and attention_on_gemm_path on both GEMM paths.
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

#include "mixtrain/core/cpu_gemm.h"
#include "support/attention_reference.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using test_support::error;
using test_support::Inputs;
using test_support::make_inputs;
using test_support::Reference;
using test_support::reference_attention;
using test_support::Result;
using test_support::Shape;
using test_support::Tolerance;
using test_support::tolerance_of;
using test_support::unit_roundoff;

Result run(AttentionKernel kernel, const Inputs& in, int64_t window = 0) {
  const auto q = in.q.detach().requires_grad_(), k = in.k.detach().requires_grad_(),
             v = in.v.detach().requires_grad_();
  const auto out = causal_attention(q, k, v, kernel, window);
  if (kernel == AttentionKernel::kFlash) {
    // at::scaled_dot_product_attention may fall back to its math backend; this must not.
    EXPECT_NE(out.grad_fn()->name().find("FlashAttention"), std::string::npos)
        << out.grad_fn()->name();
  }
  out.backward(in.dout);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
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

// Sliding-window attention (window keys per query, itself included) against the float64 reference
// with the band mask, within the same bounds as full causal attention (the band only removes
// keys from each softmax, so every rounding argument of tolerance_of holds with fewer terms);
// windows 1 (each position sees itself only), 5 and >= seq (plain causal, bitwise the same as
// window 0).
TEST(Attention, SlidingWindowMatchesTheReference) {
  uint64_t seed = 100;
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const double u = unit_roundoff(dtype);
    for (const Shape& shape : kShapes) {
      const Inputs in = make_inputs(shape, dtype, 1.0, seed++);
      for (const int64_t window : {int64_t{1}, int64_t{5}}) {
        const Reference ref = reference_attention(in, window);
        for (AttentionKernel kernel : {AttentionKernel::kMath, AttentionKernel::kFlash}) {
          const Result got = run(kernel, in, window);
          const Tolerance tol = tolerance_of(kernel, shape, u, ref.sigma);
          const std::string where = std::string(attention_kernel_name(kernel)) + " " +
                                    c10::toString(dtype) + " S=" + std::to_string(shape.seq) +
                                    " window " + std::to_string(window);
          EXPECT_LE(error(got.out, ref.value.out, ref.magnitude.out), tol.out) << where;
          EXPECT_LE(error(got.dq, ref.value.dq, ref.magnitude.dq), tol.dq) << where;
          EXPECT_LE(error(got.dk, ref.value.dk, ref.magnitude.dk), tol.dk) << where;
          EXPECT_LE(error(got.dv, ref.value.dv, ref.magnitude.dv), tol.dv) << where;
        }
      }
      for (AttentionKernel kernel : {AttentionKernel::kMath, AttentionKernel::kFlash}) {
        EXPECT_TRUE(torch::equal(run(kernel, in, shape.seq).out, run(kernel, in).out));
      }
    }
  }
}

// QK-clip's statistic with a window: the max over the band only, against the reference's scores.
TEST(AttentionMaxLogits, SlidingWindowTakesTheBandOnly) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const auto q = torch::randn({2, 4, 9, 8}, gen), k = torch::randn({2, 2, 9, 8}, gen);
  const auto got = causal_max_logits(q, k, {}, {}, /*window=*/3);
  const auto scores =
      at::matmul(q.to(torch::kFloat64), repeat_kv(k, 2).to(torch::kFloat64).transpose(2, 3)) /
      std::sqrt(8.0);
  const auto hidden = torch::ones({9, 9}, torch::kBool)
                          .triu(1)
                          .logical_or(torch::ones({9, 9}, torch::kBool).tril(-3));
  const auto expected =
      std::get<0>(scores.masked_fill(hidden, -1e300).amax({2, 3}).max(0)).to(torch::kFloat32);
  // float32 scores of 8-term dot products against float64: ~1e-6 relative; bound 1e-5.
  EXPECT_TRUE(torch::allclose(got, expected, 1e-5, 1e-5)) << got << expected;
  EXPECT_FALSE(torch::allclose(causal_max_logits(q, k), expected, 1e-5, 1e-5))
      << "the band must matter on this case";
}

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
      // Alone on the thread count of `one`, which it is compared with (the math kernel in
      // float32 is not thread-invariant; the process's own count may be any).
      at::set_num_threads(1);
      Inputs middle;  // sequence 1 of the batch on its own
      middle.q = in.q.narrow(0, 1, 1);
      middle.k = in.k.narrow(0, 1, 1);
      middle.v = in.v.narrow(0, 1, 1);
      middle.dout = in.dout.narrow(0, 1, 1);
      const Result alone = run(kernel, middle);
      at::set_num_threads(threads);
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

TEST(Attention, TheModelsKernelIsFlashInFloat32OnlyOnTheCpuAndAlwaysOnCuda) {
  EXPECT_EQ(attention_kernel_for(torch::kFloat32), AttentionKernel::kFlash);
  EXPECT_EQ(attention_kernel_for(torch::kBFloat16), AttentionKernel::kMath);
  EXPECT_EQ(attention_kernel_for(torch::kHalf), AttentionKernel::kMath);
  const c10::Device cuda(c10::kCUDA, 0);  // only named: no device is touched
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
    EXPECT_EQ(attention_kernel_for(dtype, cuda), AttentionKernel::kFlash);
  }
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

// The model's call on each GEMM path (core/cpu_gemm.h): native, the layer's own call with
// attention_kernel_for(bf16) on the bf16 tensors as given; widened, the float32 model's kernel on
// q, k, v widened, its output (and so every gradient) that of the float32 computation rounded
// once; in float32 nothing changes on either path.
TEST(Attention, OnTheWidenedGemmPathBf16AttentionIsTheFloat32OneRoundedOnce) {
  torch::manual_seed(8);
  const auto make = [](int64_t heads, c10::ScalarType dtype) {
    return torch::randn({2, heads, 11, 8}).to(dtype).requires_grad_();
  };
  for (const CpuGemmPath path : {CpuGemmPath::kNative, CpuGemmPath::kWidened}) {
    const ScopedCpuGemmPath forced(path);
    for (const auto dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat32}) {
      SCOPED_TRACE(std::string(cpu_gemm_path_name(path)) + " " + c10::toString(dtype));
      const auto q = make(4, dtype), k = make(2, dtype), v = make(2, dtype);
      std::vector<std::pair<c10::ScalarType, AttentionKernel>> seen;
      const auto out = attention_on_gemm_path(q, k, v,
                                              [&](const torch::Tensor& a, const torch::Tensor& b,
                                                  const torch::Tensor& c, AttentionKernel kernel) {
                                                seen.emplace_back(a.scalar_type(), kernel);
                                                EXPECT_EQ(b.scalar_type(), a.scalar_type());
                                                EXPECT_EQ(c.scalar_type(), a.scalar_type());
                                                return causal_attention(a, b, c, kernel);
                                              });
      const bool widened = path == CpuGemmPath::kWidened && dtype != torch::kFloat32;
      ASSERT_EQ(seen.size(), 1u);
      EXPECT_EQ(seen[0].first, widened ? torch::kFloat32 : dtype);
      EXPECT_EQ(seen[0].second, widened ? AttentionKernel::kFlash : attention_kernel_for(dtype));
      ASSERT_EQ(out.scalar_type(), dtype);
      const auto grad = torch::randn(out.sizes()).to(dtype);
      out.backward(grad);
      // The same computation written out: widened operands, the kernel, one rounding.
      const auto qf = q.detach().to(torch::kFloat32).requires_grad_(),
                 kf = k.detach().to(torch::kFloat32).requires_grad_(),
                 vf = v.detach().to(torch::kFloat32).requires_grad_();
      const auto expected =
          widened
              ? causal_attention(qf, kf, vf, AttentionKernel::kFlash).to(dtype)
              : causal_attention(q.detach(), k.detach(), v.detach(), attention_kernel_for(dtype));
      EXPECT_TRUE(torch::equal(out.detach(), expected.detach()));
      if (widened) {
        expected.backward(grad);
        EXPECT_TRUE(torch::equal(q.grad(), qf.grad().to(dtype)));
        EXPECT_TRUE(torch::equal(k.grad(), kf.grad().to(dtype)));
        EXPECT_TRUE(torch::equal(v.grad(), vf.grad().to(dtype)));
      }
    }
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
