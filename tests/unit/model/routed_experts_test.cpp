// model/routed_experts.h on the CPU: the grouped form (LibTorch's grouped GEMM, group ends on
// the device) against the loop form and both against a float64 reference computed token by
// token from the formula (support/routed_experts_reference.h), output and every gradient (hidden,
// routing weights, the three stacked weights); an expert with no token; the host reads each form
// makes. Tolerances, relative to the largest magnitude of the quantity: both forms compute each
// GEMM in float32 and round its output to bfloat16 (u = 2^-8), then a SwiGLU product, the down GEMM
// and the weighting each round once more, and the sum over the top-k slots once per slot (loop)
// or once (grouped): at most ~6 roundings along any path, and the backward as many again; 12 u
// bounds every quantity; both forms are measured far below it. A wrong expert, slot weight or
// order is off by O(1).
#include "mixtrain/model/routed_experts.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/cpu_gemm.h"
#include "mixtrain/core/host_sync.h"
#include "support/routed_experts_reference.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using test_support::ExpertInputs;
using test_support::ExpertResult;
using test_support::make_expert_inputs;
using test_support::reference_form;
using test_support::relative;
using test_support::run_experts;

TEST(RoutedExperts, BothFormsMatchTheFloat64ReferenceAndEachOther) {
  const ExpertInputs in = make_expert_inputs();
  const ExpertResult ref = run_experts(reference_form, in, at::kDouble);
  const ExpertResult loop = run_experts(routed_experts_loop, in, at::kBFloat16);
  const ExpertResult grouped = run_experts(routed_experts_grouped, in, at::kBFloat16);
  const double u = std::ldexp(1.0, -8);
  const char* names[] = {"out", "d hidden", "d weights", "d gate", "d up", "d down"};
  for (size_t i = 0; i < ref.values.size(); ++i) {
    ASSERT_GT(ref.values[i].abs().max().item<double>(), 0.01) << names[i];  // not vacuous
    EXPECT_EQ(grouped.values[i].scalar_type(), at::kBFloat16) << names[i];
    const double e_loop = relative(loop.values[i], ref.values[i]);
    const double e_grouped = relative(grouped.values[i], ref.values[i]);
    std::printf("%-10s loop %.2f u, grouped %.2f u\n", names[i], e_loop / u, e_grouped / u);
    EXPECT_LE(e_loop, 12 * u) << names[i];
    EXPECT_LE(e_grouped, 12 * u) << names[i];
  }
  // The empty expert gets a zero gradient from both forms.
  EXPECT_EQ(grouped.values[3][2].abs().max().item<double>(), 0.0);
  EXPECT_EQ(loop.values[3][2].abs().max().item<double>(), 0.0);
}

TEST(RoutedExperts, OnlyTheLoopReadsOnTheHost) {
  const ExpertInputs in = make_expert_inputs();
  reset_host_reads();
  routed_experts_grouped(in.hidden, in.selected, in.weights, in.gate, in.up, in.down);
  EXPECT_EQ(host_reads().total, 0);
  routed_experts_loop(in.hidden, in.selected, in.weights, in.gate, in.up, in.down);
  EXPECT_EQ(host_reads().by_site, (std::map<std::string, int64_t>{{"moe: tokens per expert", 1}}));
}

TEST(RoutedExperts, TheGroupedFormIsForBf16OnCudaWithAlignedDims) {
  const ExpertInputs in = make_expert_inputs();
  EXPECT_FALSE(grouped_experts_supported(in.hidden, in.gate, in.up, in.down));  // the CPU
}

// The forms agree in float32 too (no bfloat16 rounding between the GEMMs), within float32's
// reordering of the same sums: 1e-5 relative.
TEST(RoutedExperts, FormsAgreeInFloat32) {
  const ExpertInputs in = make_expert_inputs();
  const ExpertResult loop = run_experts(routed_experts_loop, in, at::kFloat);
  const ExpertResult grouped = run_experts(routed_experts_grouped, in, at::kFloat);
  for (size_t i = 0; i < loop.values.size(); ++i) {
    EXPECT_LE(relative(grouped.values[i], loop.values[i].to(at::kDouble)), 1e-5) << i;
  }
}

TEST(RoutedExperts, ExpertGemmRowsRoundUpToAFewShapesPerOctave) {
  // Multiples of 32, and of 1/8 of the largest power of two <= rows from 256 rows on.
  EXPECT_EQ(expert_gemm_rows(1), 32);
  EXPECT_EQ(expert_gemm_rows(32), 32);
  EXPECT_EQ(expert_gemm_rows(33), 64);
  EXPECT_EQ(expert_gemm_rows(256), 256);
  EXPECT_EQ(expert_gemm_rows(257), 288);    // 256 / 8 = 32
  EXPECT_EQ(expert_gemm_rows(1000), 1024);  // 512 / 8 = 64
  EXPECT_EQ(expert_gemm_rows(1025), 1152);  // 1024 / 8 = 128
  for (int64_t n = 1; n < 5000; ++n) {
    const int64_t padded = expert_gemm_rows(n);
    ASSERT_GE(padded, n);
    ASSERT_LE(padded - n, std::max<int64_t>(31, n / 8)) << n;
  }
}

// expert_mlp pads the rows of bfloat16 CPU GEMMs that oneDNN runs (routed_experts.h); its bits
// must be those of the same MLP unpadded: output and every gradient, 1, 2 and 4 threads, expert
// shapes from the tests' (24 x 12) to wider ones, row counts on both sides of ATen's oneDNN
// threshold (for 24 x 12: 14 rows below, 15 above) and on and off the padding steps. The
// threshold is why: padding 8 rows of the 24 x 12 expert to 32 would move its GEMMs from ATen's
// kernel to oneDNN, which changed single elements of 1 in ~500 such GEMMs when measured
// (and failed the 8-rank scenario test); expert_mlp leaves those rows unpadded. Checked to fail
// when expert_mlp pads regardless of the threshold.
TEST(RoutedExperts, ExpertMlpPaddingChangesNoBit) {
  if (cpu_gemm_path(at::kBFloat16) == CpuGemmPath::kWidened) {
    GTEST_SKIP() << "expert_mlp pads on the native bf16 path only (oneDNN's per-shape kernel "
                 << "cache); this machine's bf16 GEMMs are widened, where nothing pads "
                 << "(PadsTheExpertGemmsOnTheNativeBf16PathOnly checks that): "
                 << cpu_gemm_summary();
  }
  at::manual_seed(29);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{24, 12}, {64, 64}, {48, 40}, {96, 128}};
  const std::vector<int64_t> row_counts = {1,  2,  3,  5,  8,  13, 14,  15, 16,
                                           17, 31, 33, 47, 64, 65, 100, 257};
  const auto run = [](const std::vector<at::Tensor>& inputs, const at::Tensor& grad, bool padded) {
    std::vector<at::Tensor> leaves;
    for (const at::Tensor& t : inputs) leaves.push_back(t.clone().requires_grad_());
    const at::Tensor &x = leaves[0], &g = leaves[1], &u = leaves[2], &d = leaves[3];
    const at::Tensor y = padded ? expert_mlp(x, g, u, d)
                                : at::linear(at::silu(at::linear(x, g)) * at::linear(x, u), d);
    y.backward(grad);
    std::vector<at::Tensor> results{y.detach()};
    for (const at::Tensor& leaf : leaves) results.push_back(leaf.grad());
    return results;
  };
  int64_t padded_cases = 0;
  const int threads_before = at::get_num_threads();
  for (const int threads : {1, 2, 4}) {
    at::set_num_threads(threads);
    for (const auto& [hidden, inter] : shapes) {
      for (const int64_t n : row_counts) {
        if (n * hidden * inter > kOneDnnMinGemmSize && expert_gemm_rows(n) != n) ++padded_cases;
        for (int trial = 0; trial < 3; ++trial) {
          // Trial 2 puts x and gate at 2^-64: the gate GEMM's products are float32 subnormals,
          // which oneDNN flushes to zero and ATen's kernel keeps (up at 2^100 carries them into
          // the output), so a GEMM moved from one to the other by padding differs in most
          // elements (with plain random values in ~1 of 500 GEMMs).
          const bool tiny = trial == 2;
          const double small = tiny ? std::ldexp(1.0, -64) : 1.0;
          const double large = tiny ? std::ldexp(1.0, 100) : 1.0;
          const std::vector<at::Tensor> inputs = {
              (at::randn({n, hidden}) * small).to(at::kBFloat16),
              (at::randn({inter, hidden}) * 0.2 * small).to(at::kBFloat16),
              (at::randn({inter, hidden}) * 0.2 * large).to(at::kBFloat16),
              (at::randn({hidden, inter}) * 0.2).to(at::kBFloat16)};
          const at::Tensor grad = at::randn({n, hidden}).to(at::kBFloat16);
          const auto mine = run(inputs, grad, true), reference = run(inputs, grad, false);
          const char* names[] = {"output", "x grad", "gate grad", "up grad", "down grad"};
          for (size_t i = 0; i < mine.size(); ++i) {
            ASSERT_TRUE(at::equal(mine[i], reference[i]))
                << names[i] << ", " << n << " rows, " << hidden << " x " << inter << ", threads "
                << threads;
          }
        }
      }
    }
  }
  EXPECT_GT(padded_cases, 120);  // not vacuous: most cases pad
  at::set_num_threads(threads_before);
}

// The loop form (expert_mlp's padding for all experts at once) against the same loop without
// padding: uneven expert row counts, an expert with none, output and every gradient including
// the routing weights'. Two cases: wide experts whose row counts all pad, and the tests' 24 x 12
// experts with row counts on both sides of the oneDNN threshold (15 rows) and expert_mlp's
// subnormal inputs (x and gate at 2^-64, up at 2^100), which show a GEMM moved across it.
TEST(RoutedExperts, TheLoopFormsBitsAreThoseOfTheUnpaddedLoop) {
  if (cpu_gemm_path(at::kBFloat16) == CpuGemmPath::kWidened) {
    GTEST_SKIP() << "expert_mlp pads on the native bf16 path only (oneDNN's per-shape kernel "
                 << "cache); this machine's bf16 GEMMs are widened, where nothing pads "
                 << "(PadsTheExpertGemmsOnTheNativeBf16PathOnly checks that): "
                 << cpu_gemm_summary();
  }
  struct Case {
    int64_t tokens, hidden, inter;
    bool subnormal;
  };
  const int threads_before = at::get_num_threads();
  for (const Case& c : {Case{301, 48, 40, false}, Case{41, 24, 12, true}}) {
    at::manual_seed(21);
    const int64_t experts = 6, top_k = 2;
    // Expert 5 gets no token; the others uneven counts.
    at::Tensor selected = at::randint(0, experts - 1, {c.tokens, top_k}, at::kLong);
    selected.select(1, 1).copy_((selected.select(1, 0) + 1) % (experts - 1));
    const double small = c.subnormal ? std::ldexp(1.0, -64) : 1.0;
    const double large = c.subnormal ? std::ldexp(1.0, 100) : 1.0;
    const at::Tensor x0 = (at::randn({c.tokens, c.hidden}) * small).to(at::kBFloat16);
    const at::Tensor w0 = at::rand({c.tokens, top_k}).to(at::kBFloat16);
    const at::Tensor g0 = (at::randn({experts, c.inter, c.hidden}) * 0.2 * small).to(at::kBFloat16);
    const at::Tensor u0 = (at::randn({experts, c.inter, c.hidden}) * 0.2 * large).to(at::kBFloat16);
    const at::Tensor d0 = (at::randn({experts, c.hidden, c.inter}) * 0.2).to(at::kBFloat16);
    const at::Tensor grad = at::randn({c.tokens, c.hidden}).to(at::kBFloat16);
    if (c.subnormal) {  // not vacuous: experts below and above the threshold
      const std::vector<int64_t> counts = rows_by_expert(selected, w0, experts).per_expert;
      const int64_t rows_at_threshold = kOneDnnMinGemmSize / (c.hidden * c.inter);
      EXPECT_TRUE(std::any_of(counts.begin(), counts.end(),
                              [&](int64_t n) { return n > 0 && n <= rows_at_threshold; }));
      EXPECT_TRUE(std::any_of(counts.begin(), counts.end(),
                              [&](int64_t n) { return n > rows_at_threshold; }));
    }
    const auto run = [&](bool padded) {
      std::vector<at::Tensor> leaves;
      for (const at::Tensor& t : {x0, w0, g0, u0, d0}) leaves.push_back(t.clone().requires_grad_());
      const at::Tensor &x = leaves[0], &w = leaves[1], &g = leaves[2], &u = leaves[3],
                       &d = leaves[4];
      at::Tensor out;
      if (padded) {
        out = routed_experts_loop(x, selected, w, g, u, d);
      } else {
        const ExpertRows rows = rows_by_expert(selected, w, experts);
        out = at::zeros_like(x);
        const auto gs = g.unbind(0), us = u.unbind(0), ds = d.unbind(0);
        const auto idx = rows.token_index.split_with_sizes(rows.per_expert);
        const auto ws = rows.weights.unsqueeze(-1).split_with_sizes(rows.per_expert);
        for (int64_t e = 0; e < experts; ++e) {
          if (rows.per_expert[e] == 0) continue;
          const at::Tensor xe = x.index_select(0, idx[e]);
          const at::Tensor y =
              at::linear(at::silu(at::linear(xe, gs[e])) * at::linear(xe, us[e]), ds[e]);
          out.index_add_(0, idx[e], y * ws[e]);
        }
      }
      // A second use of the hidden states, as the residual stream's: their gradient sums its
      // term with the experts' pieces, in bfloat16, in autograd's order.
      const at::Tensor residual = x * 3;
      ((out.to(at::kFloat) + residual.to(at::kFloat)) * grad.to(at::kFloat)).sum().backward();
      std::vector<at::Tensor> results{out};
      for (const at::Tensor& leaf : leaves) results.push_back(leaf.grad());
      return results;
    };
    for (const int threads : {1, 2}) {
      at::set_num_threads(threads);
      const auto mine = run(true), reference = run(false);
      const char* names[] = {"output",    "hidden grad", "weights grad",
                             "gate grad", "up grad",     "down grad"};
      for (size_t i = 0; i < mine.size(); ++i) {
        EXPECT_TRUE(at::equal(mine[i], reference[i]))
            << names[i] << ", threads " << threads << ", " << c.hidden << " x " << c.inter;
      }
    }
  }
  at::set_num_threads(threads_before);
}

// The row count and dtype of the first operand of every aten::mm `fn` dispatches on this
// thread (what the routed experts' GEMMs run on: layers.h dense() takes gemm::mm for 2-D rows),
// observed with a thread-local RecordFunction callback that reads the op's inputs.
struct GemmCall {
  int64_t rows;
  c10::ScalarType dtype;
};
thread_local std::vector<GemmCall>* t_gemm_calls = nullptr;

std::vector<GemmCall> gemms_of(const std::function<void()>& fn) {
  std::vector<GemmCall> calls;
  t_gemm_calls = &calls;
  const at::CallbackHandle handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction& record) -> std::unique_ptr<at::ObserverContext> {
            if (t_gemm_calls == nullptr || std::string(record.name()) != "aten::mm") return nullptr;
            const at::Tensor& a = record.inputs()[0].toTensor();
            t_gemm_calls->push_back({a.size(0), a.scalar_type()});
            return nullptr;
          })
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION}));
  fn();
  at::removeCallback(handle);
  t_gemm_calls = nullptr;
  return calls;
}

// The tests above show that the padding changes no bit, which they would also show if it never
// happened. Here, where it is meant to happen: with core/cpu_gemm.h's native bf16 path forced
// (ScopedCpuGemmPath), padded_expert_rows answers expert_gemm_rows(n) above oneDNN's threshold
// and n at or below it, and the GEMMs expert_mlp and the loop form dispatch run on the padded
// row counts (every aten::mm of an expert's gate, up and down projections, observed); on the
// widened path (a float32 GEMM, no oneDNN kernel per shape to spare) and in float32 nothing is
// padded and the GEMMs run on the routed rows themselves. Checked to fail when
// padded_expert_rows returns its rows unchanged, and when it ignores widens_gemm.
TEST(RoutedExperts, PadsTheExpertGemmsOnTheNativeBf16PathOnly) {
  at::manual_seed(31);
  const int64_t hidden = 64, inter = 48;
  const auto bf16 = [](std::vector<int64_t> shape) {
    return (at::randn(shape) * 0.2).to(at::kBFloat16);
  };
  const at::Tensor x = bf16({13, hidden}), gate = bf16({inter, hidden}), up = bf16({inter, hidden}),
                   down = bf16({hidden, inter});
  const at::Tensor small_gate = bf16({12, 24});  // 5 x 24 x 12 = 1440: ATen's kernel, no padding
  const auto expert_mlp_gemms = [&] { return gemms_of([&] { expert_mlp(x, gate, up, down); }); };
  // The loop form: 6 experts, top 2, uneven counts, expert 5 with none.
  const int64_t tokens = 101, experts = 6;
  at::Tensor selected = at::randint(0, experts - 1, {tokens, 2}, at::kLong);
  selected.select(1, 1).copy_((selected.select(1, 0) + 1) % (experts - 1));
  const at::Tensor hidden_states = bf16({tokens, hidden}), weights = at::rand({tokens, 2});
  const at::Tensor gates = bf16({experts, inter, hidden}), ups = bf16({experts, inter, hidden}),
                   downs = bf16({experts, hidden, inter});
  const std::vector<int64_t> counts =
      rows_by_expert(selected, weights.to(at::kBFloat16), experts).per_expert;
  const auto loop_gemm_rows = [&] {
    std::vector<int64_t> rows;
    for (const GemmCall& call : gemms_of([&] {
           routed_experts_loop(hidden_states, selected, weights.to(at::kBFloat16), gates, ups,
                               downs);
         })) {
      EXPECT_EQ(call.dtype, at::kBFloat16);
      rows.push_back(call.rows);
    }
    std::sort(rows.begin(), rows.end());
    return rows;
  };
  // Each non-empty expert's three GEMMs on `rows_of(count)` rows, sorted.
  const auto expected_loop_rows = [&](const std::function<int64_t(int64_t)>& rows_of) {
    std::vector<int64_t> rows;
    for (const int64_t n : counts) {
      if (n > 0) rows.insert(rows.end(), 3, rows_of(n));
    }
    std::sort(rows.begin(), rows.end());
    return rows;
  };
  {
    const ScopedCpuGemmPath native(CpuGemmPath::kNative);
    ASSERT_FALSE(widens_gemm(x));
    EXPECT_EQ(padded_expert_rows(13, x, gate), 32);
    EXPECT_EQ(padded_expert_rows(64, x, gate), 64);
    EXPECT_EQ(padded_expert_rows(257, x, gate), 288);
    EXPECT_EQ(padded_expert_rows(5, x, small_gate), 5);
    EXPECT_EQ(padded_expert_rows(13, x.to(at::kFloat), gate.to(at::kFloat)), 13);
    const auto calls = expert_mlp_gemms();
    ASSERT_EQ(calls.size(), 3u);  // gate, up, down
    for (const GemmCall& call : calls) {
      EXPECT_EQ(call.rows, 32) << "expert_mlp's GEMMs ran on the 13 routed rows unpadded";
      EXPECT_EQ(call.dtype, at::kBFloat16);
    }
    int64_t padded_experts = 0;
    for (const int64_t n : counts) padded_experts += n > 0 && expert_gemm_rows(n) != n;
    EXPECT_GT(padded_experts, 2) << "not vacuous: most experts' row counts pad";
    EXPECT_EQ(loop_gemm_rows(), expected_loop_rows(expert_gemm_rows));
  }
  {
    const ScopedCpuGemmPath widened(CpuGemmPath::kWidened);
    ASSERT_TRUE(widens_gemm(x));
    EXPECT_EQ(padded_expert_rows(13, x, gate), 13);
    EXPECT_EQ(padded_expert_rows(257, x, gate), 257);
    const auto calls = expert_mlp_gemms();
    ASSERT_EQ(calls.size(), 3u);
    for (const GemmCall& call : calls) {
      EXPECT_EQ(call.rows, 13) << "the widened path padded";
      EXPECT_EQ(call.dtype, at::kFloat);
    }
    std::vector<int64_t> rows;
    for (const GemmCall& call : gemms_of([&] {
           routed_experts_loop(hidden_states, selected, weights.to(at::kBFloat16), gates, ups,
                               downs);
         })) {
      EXPECT_EQ(call.dtype, at::kFloat);
      rows.push_back(call.rows);
    }
    std::sort(rows.begin(), rows.end());
    EXPECT_EQ(rows, expected_loop_rows([](int64_t n) { return n; }));
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
