// One mixed-precision AdamW step: float32 main params p, grads g and moments m, v; the update
// also writes the bfloat16 model params. 16M and 64M params, 1 thread and every thread.
//   BM_FusedAdamW           mixtrain::AdamW with a bf16 copy-back target (one fused pass);
//   BM_TensorOpsAdamW       baseline (a): the same math as LibTorch tensor ops, the way the
//                           Python originals run it (torch.optim.AdamW, foreach=False, then
//                           model.copy_(main)): mul_, lerp_, mul_, addcmul_, sqrt, div, add_,
//                           addcdiv_, copy_;
//   BM_TorchAdamWPlusCopy   baseline (b): torch::optim::AdamW::step() on float32, then
//                           model.copy_(param);
//   BM_CopyBandwidth        STREAM Copy between two buffers of 16 bytes/param each, split over
//                           the threads like the kernel. Its rate (bytes read + written per
//                           second, STREAM's count) gives bound (c): the step's 30 bytes/param
//                           at copy bandwidth. A loose bound: a copy's destination is read
//                           before it is written (write-allocate) and STREAM does not count
//                           that, while the step updates p, m, v in place and pays it only for
//                           the 2-byte model param;
//   BM_StreamBound          a second, tighter reference: the step's own eight streams (reads p,
//                           g, m, v; writes p, m, v and a 16-bit copy of p), vectorized, no real
//                           arithmetic.
// Bytes per param: 4 reads + 3 writes of float32 + one bf16 write = 30. Every benchmark reports
// GB/s at 30 bytes/param and `of_copy_bound` = bound (c) / its time, at the same size and thread
// count. After the runs a summary prints, per size and thread count, each step's best time
// (fewest interruptions on a shared machine) and the ratios the issue targets: fused vs (a),
// fused vs (b) (target >= 5x), fused vs (c) (target >= 0.85 on 1 thread, >= 0.75 on all).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <tuple>

#include "mixtrain/optim/adamw.h"

namespace {

constexpr double kBytesPerParam = 30.0;
constexpr int64_t kChunk = int64_t{1} << 16;

using Clock = std::chrono::steady_clock;

// Best seconds per step of each benchmark, keyed by (name, params, threads), for the summary.
std::map<std::tuple<std::string, int64_t, int>, double>& best_seconds() {
  static std::map<std::tuple<std::string, int64_t, int>, double> best;
  return best;
}

// The stream kernel behind BM_StreamBound: in-place adds keep every stream live, the top half of
// p's bits stands in for the bf16 store. Plain loops that GCC vectorizes.
void stream_pass(float* p, const float* g, float* m, float* v, uint16_t* out, int64_t n) {
  at::parallel_for(0, (n + kChunk - 1) / kChunk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) {
        const float x = p[i] + g[i];
        p[i] = x;
        m[i] += g[i];
        v[i] += g[i];
        uint32_t bits;
        std::memcpy(&bits, &x, sizeof(bits));
        out[i] = static_cast<uint16_t>(bits >> 16);
      }
    }
  });
}

// STREAM's Copy kernel (dst[i] = src[i] over floats, vectorized; counted as 8 bytes moved per
// element, read + write) in chunks of kChunk, the chunks split over the threads. Kept a plain
// loop: GCC would otherwise turn it into a memcpy call, which uses `rep movsb` on this CPU.
__attribute__((optimize("no-tree-loop-distribute-patterns"))) void copy_pass(
    float* __restrict dst, const float* __restrict src, int64_t n) {
  at::parallel_for(0, (n + kChunk - 1) / kChunk, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) dst[i] = src[i];
    }
  });
}

// Seconds per step at copy bandwidth (bound (c)): the best of several copies of 16 bytes/param,
// measured once per (params, threads) before the benchmark that needs it.
double copy_bound_seconds(int64_t params, int threads) {
  static std::map<std::pair<int64_t, int>, double> cache;
  const auto key = std::make_pair(params, threads);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  at::set_num_threads(threads);
  const int64_t floats = 4 * params;  // 16 bytes/param in each buffer
  at::Tensor src = at::ones({floats}), dst = at::zeros({floats});
  double best = 1e30;
  for (int k = 0; k < 11; ++k) {  // the first pass touches the memory
    const auto start = Clock::now();
    copy_pass(dst.data_ptr<float>(), src.data_ptr<float>(), floats);
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (k > 0) best = std::min(best, s);
  }
  const double copy_rate = 8.0 * static_cast<double>(floats) / best;  // bytes read + written
  return cache[key] = kBytesPerParam * static_cast<double>(params) / copy_rate;
}

// Times `step` (after one untimed call that creates state and touches memory) and reports.
template <typename Step>
void measure(benchmark::State& state, const char* name, Step&& step) {
  const int64_t params = state.range(0) << 20;
  const int threads = static_cast<int>(state.range(1));
  const double bound = copy_bound_seconds(params, threads);
  at::set_num_threads(threads);
  step();
  double total = 0, best = 1e30;
  for (auto _ : state) {
    const auto start = Clock::now();
    step();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    total += s;
    best = std::min(best, s);
  }
  const double per_step = total / static_cast<double>(state.iterations());
  state.counters["GB/s"] = kBytesPerParam * static_cast<double>(params) / per_step / 1e9;
  state.counters["of_copy_bound"] = bound / per_step;
  double& recorded = best_seconds()[{name, params, threads}];
  recorded = recorded == 0 ? best : std::min(recorded, best);
}

struct AdamWTensors {
  at::Tensor param, model, grad;
  explicit AdamWTensors(int64_t params) {
    at::manual_seed(0);
    param = at::randn({params}).requires_grad_(true);
    model = param.detach().to(at::kBFloat16);
    grad = at::randn({params});
    param.mutable_grad() = grad;
  }
};

void BM_FusedAdamW(benchmark::State& state) {
  AdamWTensors t(state.range(0) << 20);
  mixtrain::AdamW optimizer({torch::optim::OptimizerParamGroup({t.param})});
  optimizer.set_copy_back(t.param, t.model);
  measure(state, "fused", [&] { optimizer.step(); });
}

// torch.optim.AdamW's single-tensor step (hyper-parameters at torch's defaults), then the copy
// to the model param, as LibTorch tensor ops.
void BM_TensorOpsAdamW(benchmark::State& state) {
  AdamWTensors t(state.range(0) << 20);
  const double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  const at::NoGradGuard no_grad;
  at::Tensor p = t.param.detach(), m = at::zeros_like(p), v = at::zeros_like(p);
  int64_t step_count = 0;
  measure(state, "tensor_ops", [&] {
    ++step_count;
    p.mul_(1 - lr * weight_decay);
    m.lerp_(t.grad, 1 - beta1);
    v.mul_(beta2).addcmul_(t.grad, t.grad, 1 - beta2);
    const double bias_correction1 = 1 - std::pow(beta1, step_count);
    const double bias_correction2 = 1 - std::pow(beta2, step_count);
    const at::Tensor denom = (v.sqrt() / std::sqrt(bias_correction2)).add_(eps);
    p.addcdiv_(m, denom, -lr / bias_correction1);
    t.model.copy_(p);
  });
}

void BM_TorchAdamWPlusCopy(benchmark::State& state) {
  AdamWTensors t(state.range(0) << 20);
  torch::optim::AdamW optimizer({torch::optim::OptimizerParamGroup({t.param})});
  measure(state, "torch_adamw", [&] {
    optimizer.step();
    const at::NoGradGuard no_grad;
    t.model.copy_(t.param);
  });
}

void BM_CopyBandwidth(benchmark::State& state) {
  const int64_t params = state.range(0) << 20;
  const int threads = static_cast<int>(state.range(1));
  const double bound = copy_bound_seconds(params, threads);
  // The bound's own figure: report it as a benchmark for the table (its time is bound (c)).
  for (auto _ : state) benchmark::DoNotOptimize(bound);
  state.counters["GB/s"] = kBytesPerParam * static_cast<double>(params) / bound / 1e9;
  state.counters["of_copy_bound"] = 1.0;
  best_seconds()[{"copy_bound", params, threads}] = bound;
}

void BM_StreamBound(benchmark::State& state) {
  const int64_t params = state.range(0) << 20;
  at::Tensor p = at::zeros({params}), g = at::full({params}, 1e-30f), m = at::zeros({params}),
             v = at::zeros({params}), out = at::zeros({params}, at::kShort);
  measure(state, "stream", [&] {
    stream_pass(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                reinterpret_cast<uint16_t*>(out.data_ptr<int16_t>()), params);
  });
}

// Millions of params x threads: {16, 64} x {1, every thread}.
void sizes_and_threads(benchmark::internal::Benchmark* b) {
  // Every core, as `mixtrain train` uses (LibTorch 1.13's own default here is 1 thread), or
  // OMP_NUM_THREADS when set.
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const int all = omp != nullptr
                      ? std::max(1, std::atoi(omp))
                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int64_t millions : {16, 64}) {
    b->Args({millions, 1});
    if (all > 1) b->Args({millions, all});
  }
  b->ArgNames({"Mparams", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
}

// Registered from main: at static initialization registration order is not defined.
void register_benchmarks() {
  benchmark::RegisterBenchmark("BM_CopyBandwidth", BM_CopyBandwidth)
      ->Apply(sizes_and_threads)
      ->Iterations(1);
  benchmark::RegisterBenchmark("BM_StreamBound", BM_StreamBound)->Apply(sizes_and_threads);
  benchmark::RegisterBenchmark("BM_FusedAdamW", BM_FusedAdamW)->Apply(sizes_and_threads);
  benchmark::RegisterBenchmark("BM_TensorOpsAdamW", BM_TensorOpsAdamW)->Apply(sizes_and_threads);
  benchmark::RegisterBenchmark("BM_TorchAdamWPlusCopy", BM_TorchAdamWPlusCopy)
      ->Apply(sizes_and_threads);
}

void print_summary() {
  const auto& best = best_seconds();
  auto get = [&](const char* name, int64_t params, int threads) {
    auto it = best.find({name, params, threads});
    return it == best.end() ? std::nan("") : it->second;
  };
  std::printf(
      "\nSummary (best step, ms; ratios of the same run):\n"
      "| params | threads | fused | (a) tensor ops | (b) torch AdamW + copy | (c) copy bound | "
      "stream bound | fused vs (a) | fused vs (b), target >= 5 | of (c), target %s | "
      "of stream bound |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
      ">= 0.85 (1 thread), >= 0.75 (all)");
  std::map<std::pair<int64_t, int>, bool> rows;
  for (const auto& [key, seconds] : best) rows[{std::get<1>(key), std::get<2>(key)}] = true;
  for (const auto& [row, unused] : rows) {
    const auto [params, threads] = row;
    const double fused = get("fused", params, threads), a = get("tensor_ops", params, threads),
                 b = get("torch_adamw", params, threads), c = get("copy_bound", params, threads),
                 stream = get("stream", params, threads);
    std::printf("| %lldM | %d | %.2f | %.1f | %.1f | %.2f | %.2f | %.1fx | %.1fx | %.2f | %.2f |\n",
                static_cast<long long>(params >> 20), threads, fused * 1e3, a * 1e3, b * 1e3,
                c * 1e3, stream * 1e3, a / fused, b / fused, c / fused, stream / fused);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_benchmarks();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary();
  return 0;
}
