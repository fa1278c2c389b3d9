// Muon's Newton-Schulz orthogonalization (optim/newton_schulz.h: 5 asym5 steps in bfloat16)
// against its GEMM bound, on the shapes of the issue: one 1024x1024 matrix, one 4096x1024
// (transposed to 1024x4096, so the Gram matrix is 1024x1024) and an 8x512x1408 expert stack.
//
//   BM_NewtonSchulz   the library's newton_schulz();
//   BM_GemmBound      the same GEMMs alone, per step: bmm(X, X^T), baddbmm(A, A, A),
//                     baddbmm(X, P, X) on tensors prepared outside the timing; its time is the
//                     bound (the step is nothing but these GEMMs plus one normalization);
//   BM_Symmetric      going below the bound: A = X X^T and A A are symmetric, so with X split
//                     in two row blocks only the blocks on and above the diagonal are computed
//                     (3 of 4 blocks of X X^T, 6 of 8 block products of A A) and the lower
//                     ones are mirrored; X P stays a full GEMM. Fewer FLOPs, smaller GEMMs.
// Counters: GFLOP/s at the full (unsymmetric) FLOP count, and `of_bound` = bound time / time.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>
#include <tuple>

#include "mixtrain/optim/newton_schulz.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  int64_t batch, rows, cols;  // as stored; Newton-Schulz works on m = min, n = max
};
constexpr std::array<Shape, 3> kShapes = {{{1, 1024, 1024}, {1, 4096, 1024}, {8, 512, 1408}}};

const std::vector<mixtrain::NsCoefficients>& schedule() {
  static const auto s = mixtrain::newton_schulz_schedule("asym5", 5, {});
  return s;
}

at::Tensor input(const Shape& s) {
  at::manual_seed(0);
  return at::randn({s.batch, s.rows, s.cols});
}

// The orthogonalization's matrix FLOPs per call: 5 steps of X X^T (2 m^2 n), A A (2 m^3) and
// P X (2 m^2 n), per matrix in the batch.
double flops(const Shape& s) {
  const double m = std::min(s.rows, s.cols), n = std::max(s.rows, s.cols);
  return 5.0 * s.batch * (4 * m * m * n + 2 * m * m * m);
}

// X X^T, then b A + c A A, from 2x2 blocks of X's rows, computing only the blocks on and above
// the diagonal and mirroring the rest.
at::Tensor symmetric_poly(const at::Tensor& x, double b, double c) {
  const int64_t m = x.size(1), h = m / 2;
  const at::Tensor x1 = x.narrow(1, 0, h), x2 = x.narrow(1, h, m - h);
  at::Tensor gram = at::empty({x.size(0), m, m}, x.options());
  const at::Tensor a11 = gram.narrow(1, 0, h).narrow(2, 0, h);
  const at::Tensor a12 = gram.narrow(1, 0, h).narrow(2, h, m - h);
  const at::Tensor a22 = gram.narrow(1, h, m - h).narrow(2, h, m - h);
  at::bmm_out(const_cast<at::Tensor&>(a11), x1, x1.transpose(1, 2));
  at::bmm_out(const_cast<at::Tensor&>(a12), x1, x2.transpose(1, 2));
  at::bmm_out(const_cast<at::Tensor&>(a22), x2, x2.transpose(1, 2));
  gram.narrow(1, h, m - h).narrow(2, 0, h).copy_(a12.transpose(1, 2));
  // P = b A + c A A, blocks (1,1), (1,2), (2,2); (2,1) mirrored.
  const at::Tensor a21 = gram.narrow(1, h, m - h).narrow(2, 0, h);
  at::Tensor poly = at::empty_like(gram);
  auto block = [&](int64_t r, int64_t c0, int64_t rows, int64_t cols) {
    return poly.narrow(1, r, rows).narrow(2, c0, cols);
  };
  block(0, 0, h, h).copy_(at::baddbmm(at::baddbmm(a11, a11, a11, b, c), a12, a21, 1.0, c));
  block(0, h, h, m - h).copy_(at::baddbmm(at::baddbmm(a12, a11, a12, b, c), a12, a22, 1.0, c));
  block(h, h, m - h, m - h).copy_(at::baddbmm(at::baddbmm(a22, a21, a12, b, c), a22, a22, 1.0, c));
  block(h, 0, m - h, h).copy_(block(0, h, h, m - h).transpose(1, 2));
  return poly;
}

at::Tensor symmetric_newton_schulz(const at::Tensor& g) {
  at::Tensor x = g.to(at::kBFloat16);
  if (x.size(1) > x.size(2)) x = x.transpose(1, 2);
  x = x.contiguous();
  x = x / (at::linalg_vector_norm(x, 2, at::IntArrayRef({1, 2}), true) + 1e-7);
  for (const auto& [a, b, c] : schedule()) x = at::baddbmm(x, symmetric_poly(x, b, c), x, a, 1.0);
  return x;
}

// Seconds of the bound for shape s and thread count: the best of a few repetitions of the
// GEMMs alone, measured once per (shape, threads).
double bound_seconds(size_t shape, int threads) {
  static std::map<std::pair<size_t, int>, double> cache;
  const auto key = std::make_pair(shape, threads);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  at::set_num_threads(threads);
  const Shape& s = kShapes[shape];
  at::Tensor x = input(s).to(at::kBFloat16);
  if (x.size(1) > x.size(2)) x = x.transpose(1, 2);
  x = x.contiguous().div(x.norm().item<float>());
  const at::Tensor gram = at::bmm(x, x.transpose(1, 2));
  const at::Tensor poly = at::baddbmm(gram, gram, gram, -6.0, 3.0);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
    for (int step = 0; step < 5; ++step) {
      benchmark::DoNotOptimize(at::bmm(x, x.transpose(1, 2)));
      benchmark::DoNotOptimize(at::baddbmm(gram, gram, gram, -6.0, 3.0));
      benchmark::DoNotOptimize(at::baddbmm(x, poly, x, 4.0, 1.0));
    }
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return cache[key] = best;
}

void report(benchmark::State& state, size_t shape, double seconds_per_call) {
  state.counters["GFLOP/s"] = flops(kShapes[shape]) / seconds_per_call / 1e9;
  state.counters["of_bound"] =
      bound_seconds(shape, static_cast<int>(state.range(1))) / seconds_per_call;
}

template <typename F>
void run(benchmark::State& state, F&& call) {
  const size_t shape = static_cast<size_t>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const double bound = bound_seconds(shape, threads);  // measured before timing starts
  (void)bound;
  at::set_num_threads(threads);
  const at::Tensor g = input(kShapes[shape]);
  // One untimed call: the first one faults in its temporaries (Google Benchmark times only a few
  // calls of these sizes, so it would weigh in the mean).
  benchmark::DoNotOptimize(call(g));
  double total = 0;
  int64_t calls = 0;
  for (auto _ : state) {
    const auto start = Clock::now();
    benchmark::DoNotOptimize(call(g));
    total += std::chrono::duration<double>(Clock::now() - start).count();
    ++calls;
  }
  report(state, shape, total / calls);
}

void BM_NewtonSchulz(benchmark::State& state) {
  run(state, [](const at::Tensor& g) {
    return mixtrain::newton_schulz(g, schedule(), 1e-7, at::kBFloat16);
  });
}
void BM_GemmBound(benchmark::State& state) {
  const size_t shape = static_cast<size_t>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(shape);
  report(state, shape, bound_seconds(shape, threads));
}
void BM_Symmetric(benchmark::State& state) {
  run(state, symmetric_newton_schulz);
}

void shapes_and_threads(benchmark::internal::Benchmark* b) {
  // Every core, as `mixtrain train` uses (LibTorch 1.13's own default here is 1 thread), or
  // OMP_NUM_THREADS when set.
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const int all = omp != nullptr
                      ? std::max(1, std::atoi(omp))
                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int64_t shape = 0; shape < static_cast<int64_t>(kShapes.size()); ++shape) {
    b->Args({shape, 1});
    if (all > 1) b->Args({shape, all});
  }
  b->ArgNames({"shape", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
}

// The symmetric variant must compute the same thing: its result against the library's, as the
// largest element difference relative to the largest element (both are bfloat16 results of
// bfloat16 GEMMs summed in another order, so they differ by bfloat16 roundings: ~1e-2).
void check_symmetric() {
  for (const Shape& s : kShapes) {
    const at::Tensor g = input(s);
    at::Tensor ours = symmetric_newton_schulz(g);
    if (s.rows > s.cols) ours = ours.transpose(1, 2);
    const at::Tensor library = mixtrain::newton_schulz(g, schedule(), 1e-7, at::kBFloat16);
    const double diff = (ours.to(at::kFloat) - library.to(at::kFloat)).abs().max().item<double>();
    const double scale = library.to(at::kFloat).abs().max().item<double>();
    std::printf("symmetric vs library, %lldx%lldx%lld: max |diff| / max |x| = %.2e\n",
                static_cast<long long>(s.batch), static_cast<long long>(s.rows),
                static_cast<long long>(s.cols), diff / scale);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Registered here: at static initialization registration order is not defined.
  benchmark::RegisterBenchmark("BM_GemmBound", BM_GemmBound)
      ->Apply(shapes_and_threads)
      ->Iterations(1);
  benchmark::RegisterBenchmark("BM_NewtonSchulz", BM_NewtonSchulz)->Apply(shapes_and_threads);
  benchmark::RegisterBenchmark("BM_Symmetric", BM_Symmetric)->Apply(shapes_and_threads);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  check_symmetric();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
