// bf16 and fp16 GEMMs on the CPU (core/cpu_gemm.h) against the float32 GEMM rate, in one run,
// per shape class of the ~41M config (bench_support.h: hidden 384, 6 heads of 64, 8 experts of
// 384, shared expert 768, vocabulary 16000, 2 x 128 tokens a micro-batch): its linear layers,
// one routed expert's GEMMs (~64 rows), Newton-Schulz's GEMMs on a square 384x384 matrix and the
// tall 16000x384 head (Gram 384x384), and causal attention (6 heads of 64, 2 kv heads, 128
// positions) forward and backward as the model's layers run it: against the float32 model's
// attention (kFlash), natively HF's eager kernel in bf16/fp16, widened the float32 one on
// widened q, k, v (model/attention.h, attention_on_gemm_path).
//
// For each shape and dtype: GFLOP/s of the float32 GEMM on float32 operands (the bound), of the
// native path (ATen's bf16/fp16 kernel), of the widened path (widen, float32 GEMM, round), and
// of the path core/cpu_gemm chose on this machine. Checks, printing met / NOT met:
//   - the chosen path at >= 0.8x the float32 rate where it is the widened one (issue 46);
//   - the chosen path no slower than the other one (within 10%: the same GEMM timed twice
//     differs by that much on a shared VM).
// The caching CPU allocator is installed, as `mixtrain train` does. Times: the median of repeats of
// ~0.1 s each (at least one call: a native GEMM below AVX-512 runs at ~1 GFLOP/s). Run with
// OMP_NUM_THREADS=1 for the figures in bench/README.md.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "mixtrain/core/build_info.h"
#include "mixtrain/core/caching_cpu_allocator.h"
#include "mixtrain/core/cpu_gemm.h"
#include "mixtrain/model/attention.h"

namespace {

using Clock = std::chrono::steady_clock;
using mixtrain::CpuGemmPath;

struct Shape {
  const char* what;
  int64_t batch, m, k, n;  // batch x [m x k] x [k x n]
};

// Causal attention as the model's layers run it (model/attention.h, attention_on_gemm_path),
// forward and backward: batch x heads (kv heads: heads / 3) x seq x head_dim.
struct AttentionShape {
  const char* what;
  int64_t batch, heads, seq, dim;
};
const AttentionShape kAttention = {"attention fwd+bwd 2x6x128x64", 2, 6, 128, 64};

// The ~41M config's GEMMs (forward shapes; backward's are the same products transposed).
const std::vector<Shape> kShapes = {
    {"linear q/o_proj 256x384x384", 1, 256, 384, 384},
    {"linear k/v_proj 256x384x128", 1, 256, 384, 128},
    {"linear shared up 256x384x768", 1, 256, 384, 768},
    {"linear shared down 256x768x384", 1, 256, 768, 384},
    {"linear head 256x384x16000", 1, 256, 384, 16000},
    {"expert gate/up 64x384x384", 1, 64, 384, 384},
    {"ns square X X^T 384x384x384", 1, 384, 384, 384},
    {"ns tall X X^T 384x16000x384", 1, 384, 16000, 384},
    {"ns tall P X 384x384x16000", 1, 384, 384, 16000},
    {"ns experts 8x384x384x384", 8, 384, 384, 384},
};

double seconds_per_call(const std::function<void()>& call) {
  call();  // warm: oneDNN builds its kernel for the shape
  std::vector<double> times;
  for (int repeat = 0; repeat < 5; ++repeat) {
    int calls = 0;
    const auto start = Clock::now();
    double elapsed = 0;
    do {
      call();
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < 0.1);
    times.push_back(elapsed / calls);
    if (elapsed > 1.0) break;  // a slow path: one long repeat says enough
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double gflops(const Shape& s, double seconds) {
  return 2.0 * s.batch * s.m * s.k * s.n / seconds / 1e9;
}

// Prints one row; returns whether its checks are met.
bool report(const char* what, c10::ScalarType dtype, double f32, double native, double widened) {
  const bool chose_native = mixtrain::cpu_gemm_path(dtype) == CpuGemmPath::kNative;
  const double chosen = chose_native ? native : widened, other = chose_native ? widened : native;
  const bool rate_met = chose_native || chosen >= 0.8 * f32;
  const bool choice_met = chosen >= 0.9 * other;
  const std::string checks =
      std::string(chose_native ? "native" : "widened") + "; >= 0.8x f32: " +
      (chose_native ? "n/a"
       : rate_met   ? "met"
                    : "NOT met") +
      "; not slower than the other path: " + (choice_met ? "met" : "NOT met");
  std::printf("%-32s %-5s %8.1f %8.1f %8.1f %8.1f %6.2fx  %s\n", what,
              dtype == at::kBFloat16 ? "bf16" : "fp16", f32, native, widened, chosen, chosen / f32,
              checks.c_str());
  return rate_met && choice_met;
}

// GFLOP/s of attention forward + backward: 4 B H S^2 D forward (Q K^T and P V at full S^2; the
// causal half is not subtracted, the same count for every column), twice that backward.
double attention_rate(const AttentionShape& s, c10::ScalarType dtype, bool as_float32) {
  at::manual_seed(0);
  const int64_t kv = s.heads / 3;
  const auto leaf = [&](int64_t heads) {
    return at::randn({s.batch, heads, s.seq, s.dim}).to(dtype).requires_grad_(true);
  };
  const at::Tensor q = leaf(s.heads), k = leaf(kv), v = leaf(kv);
  const at::Tensor grad = at::randn({s.batch, s.heads, s.seq, s.dim}).to(dtype);
  const double seconds = seconds_per_call([&] {
    const at::Tensor out =
        as_float32 ? mixtrain::causal_attention(q, k, v, mixtrain::attention_kernel_for(dtype))
                   : mixtrain::attention_on_gemm_path(
                         q, k, v,
                         [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                            mixtrain::AttentionKernel kernel) {
                           return mixtrain::causal_attention(a, b, c, kernel);
                         });
    out.backward(grad);
  });
  return 12.0 * s.batch * s.heads * s.seq * s.seq * s.dim / seconds / 1e9;
}

}  // namespace

int main() {
  // As `mixtrain train` runs (train.cpu_allocator: caching): a widened operand's float32 buffer
  // is reused, not mapped and first-touched again on every call.
  mixtrain::install_caching_cpu_allocator();
  std::printf("%s", mixtrain::format_build_info(mixtrain::build_info()).c_str());
  std::printf("threads: %d\n\n", at::get_num_threads());
  std::printf("%-32s %-5s %8s %8s %8s %8s %7s  %s\n", "shape (batch x m x k x n)", "dtype", "f32",
              "native", "widened", "chosen", "ch/f32", "checks");
  bool all_met = true;
  for (const Shape& s : kShapes) {
    at::manual_seed(0);
    const at::Tensor a = at::randn({s.batch, s.m, s.k}), b = at::randn({s.batch, s.k, s.n});
    const double f32 = gflops(s, seconds_per_call([&] { at::bmm(a, b); }));
    for (const auto dtype : {at::kBFloat16, at::kHalf}) {
      const at::Tensor al = a.to(dtype), bl = b.to(dtype);
      auto rate = [&](CpuGemmPath path) {
        mixtrain::ScopedCpuGemmPath forced(path);
        return gflops(s, seconds_per_call([&] { mixtrain::gemm::bmm(al, bl); }));
      };
      const double native = rate(CpuGemmPath::kNative), widened = rate(CpuGemmPath::kWidened);
      all_met = report(s.what, dtype, f32, native, widened) && all_met;
    }
  }
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    const double f32 = attention_rate(kAttention, at::kFloat, true);
    auto rate = [&](CpuGemmPath path) {
      mixtrain::ScopedCpuGemmPath forced(path);
      return attention_rate(kAttention, dtype, false);
    };
    const double native = rate(CpuGemmPath::kNative), widened = rate(CpuGemmPath::kWidened);
    all_met = report(kAttention.what, dtype, f32, native, widened) && all_met;
  }
  std::printf("\nGFLOP/s (2 m k n per matrix). ch/f32: the chosen path's rate over float32's.\n");
  std::printf("all checks: %s\n", all_met ? "met" : "NOT met");
  return 0;
}
