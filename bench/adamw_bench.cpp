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
//
// Steady state: every step benchmark makes kWarmupSteps untimed steps first (the first creates
// the optimizer state and first-touches every buffer), then exactly kTimedSteps timed ones, and
// reports their median wall time (counters `median_ms`, `min_ms`, `max_ms`; Google Benchmark's
// own time column is their mean), median page faults (`faults_per_step`) and median process CPU
// time (`cpu_median_ms`: user + system of every thread, which on a shared machine leaves out the
// time slices other processes take).
//
// Two heaps, in one run: every benchmark runs once with glibc's default malloc (`heap:0`), then
// once more with freed memory kept in the heap (`heap:1`, mallopt in use_heap). The baselines
// allocate per-step temporaries of 4 bytes/param (sqrt, division; torch's AdamW likewise); glibc
// serves blocks above its mmap threshold (at most 32 MiB) with a fresh mmap and unmaps them at
// free, so with the default heap every step first-touches them again, page by page: heap:0 is
// what a LibTorch program pays, heap:1 the kernel-vs-kernel figure. The fused step has none.
//
// Bytes per param: 4 reads + 3 writes of float32 + one bf16 write = 30. Every benchmark reports
// GB/s at 30 bytes/param and `of_copy_bound` = bound (c) / its median, at the same size and
// thread count. After the runs a summary prints, per size, thread count and heap, each step's
// median and the ratios the issue targets: fused vs (a), fused vs (b) (target >= 5x), fused vs
// (c) (target >= 0.85 on 1 thread, >= 0.75 on all), in wall time and in CPU time, with the load
// average before and after.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <c10/core/GradMode.h>
#include <malloc.h>
#include <sys/resource.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_support.h"
#include "mixtrain/optim/adamw.h"

namespace {

constexpr double kBytesPerParam = 30.0;
constexpr int64_t kChunk = int64_t{1} << 16;
constexpr int kWarmupSteps = 2;
constexpr int kTimedSteps = 5;

using Clock = std::chrono::steady_clock;

// Page faults of this process so far (minor + major): what the heap choice changes.
double page_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_minflt + usage.ru_majflt);
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Median seconds per step of each benchmark, keyed by (name, params, threads, heap, clock), one
// per repetition (--benchmark_repetitions), for the summary. clock 0: wall time; 1: CPU time of
// the whole process (every thread; page faults count as system time).
using Key = std::tuple<std::string, int64_t, int, int, int>;
std::map<Key, std::vector<double>>& median_seconds() {
  static std::map<Key, std::vector<double>> medians;
  return medians;
}

// heap:1 from here on: no block is served by mmap (M_MMAP_MAX 0) and the top of the heap is never
// given back (M_TRIM_THRESHOLD at its largest), so a freed temporary's pages stay mapped and the
// next step's temporary of the same size reuses them. Process-wide and not undone: main registers
// every heap:0 benchmark before any heap:1 one, and a heap:0 benchmark that runs after refuses.
bool& heap_kept() {
  static bool kept = false;
  return kept;
}
bool use_heap(benchmark::State& state, int heap) {
  if (heap == 0 && heap_kept()) {
    state.SkipWithError("heap:0 after heap:1 (mallopt cannot be undone; run them in order)");
    return false;
  }
  if (heap == 1 && !heap_kept()) {
    if (mallopt(M_MMAP_MAX, 0) != 1 || mallopt(M_TRIM_THRESHOLD, INT_MAX) != 1 ||
        mallopt(M_TOP_PAD, 64 << 20) != 1) {
      state.SkipWithError("mallopt failed");
      return false;
    }
    heap_kept() = true;
  }
  return true;
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

// Seconds per step at copy bandwidth (bound (c)): the best of several copies of 16 bytes/param
// (a bound: the fastest copy seen), measured once per (params, threads), the first time a
// benchmark needs it.
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

// Runs kWarmupSteps untimed calls of `step`, then times kTimedSteps (the benchmark is registered
// with exactly that many iterations) and reports their median.
template <typename Step>
void measure(benchmark::State& state, const char* name, Step&& step) {
  const int64_t params = state.range(0) << 20;
  const int threads = static_cast<int>(state.range(1));
  const int heap = static_cast<int>(state.range(2));
  const double bound = copy_bound_seconds(params, threads);
  at::set_num_threads(threads);
  for (int k = 0; k < kWarmupSteps; ++k) step();
  std::vector<double> seconds, cpu_seconds, faults;
  for (auto _ : state) {
    const double faults_start = page_faults();
    const double cpu_start = process_cpu_seconds();
    const auto start = Clock::now();
    step();
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    cpu_seconds.push_back(process_cpu_seconds() - cpu_start);
    faults.push_back(page_faults() - faults_start);
  }
  state.counters["faults_per_step"] = mixtrain::bench::median(faults);
  const double median = mixtrain::bench::median(seconds);
  const double cpu_median = mixtrain::bench::median(cpu_seconds);
  state.counters["cpu_median_ms"] = cpu_median * 1e3;
  state.counters["median_ms"] = median * 1e3;
  state.counters["min_ms"] = *std::min_element(seconds.begin(), seconds.end()) * 1e3;
  state.counters["max_ms"] = *std::max_element(seconds.begin(), seconds.end()) * 1e3;
  state.counters["GB/s"] = kBytesPerParam * static_cast<double>(params) / median / 1e9;
  state.counters["of_copy_bound"] = bound / median;
  median_seconds()[{name, params, threads, heap, 0}].push_back(median);
  median_seconds()[{name, params, threads, heap, 1}].push_back(cpu_median);
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
  if (!use_heap(state, static_cast<int>(state.range(2)))) return;
  AdamWTensors t(state.range(0) << 20);
  mixtrain::AdamW optimizer({torch::optim::OptimizerParamGroup({t.param})});
  optimizer.set_copy_back(t.param, t.model);
  measure(state, "fused", [&] { optimizer.step(); });
}

// torch.optim.AdamW's single-tensor step (hyper-parameters at torch's defaults), then the copy
// to the model param, as LibTorch tensor ops.
void BM_TensorOpsAdamW(benchmark::State& state) {
  if (!use_heap(state, static_cast<int>(state.range(2)))) return;
  AdamWTensors t(state.range(0) << 20);
  const double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  const c10::NoGradGuard no_grad;
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
  if (!use_heap(state, static_cast<int>(state.range(2)))) return;
  AdamWTensors t(state.range(0) << 20);
  torch::optim::AdamW optimizer({torch::optim::OptimizerParamGroup({t.param})});
  measure(state, "torch_adamw", [&] {
    optimizer.step();
    const c10::NoGradGuard no_grad;
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
  for (int heap : {0, 1}) median_seconds()[{"copy_bound", params, threads, heap, 0}] = {bound};
}

void BM_StreamBound(benchmark::State& state) {
  if (!use_heap(state, static_cast<int>(state.range(2)))) return;
  const int64_t params = state.range(0) << 20;
  at::Tensor p = at::zeros({params}), g = at::full({params}, 1e-30f), m = at::zeros({params}),
             v = at::zeros({params}), out = at::zeros({params}, at::kShort);
  measure(state, "stream", [&] {
    stream_pass(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                reinterpret_cast<uint16_t*>(out.data_ptr<int16_t>()), params);
  });
}

// Every core, as `mixtrain train` uses (LibTorch 1.13's own default here is 1 thread), or
// OMP_NUM_THREADS when set.
int all_threads() {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  return omp != nullptr ? std::max(1, std::atoi(omp))
                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Millions of params x threads x heap: {16, 64} x {1, every thread} x {Heap}. (Apply takes a
// function pointer, hence the template.)
template <int Heap>
void sizes_and_threads(benchmark::internal::Benchmark* b) {
  for (int64_t millions : {16, 64}) {
    b->Args({millions, 1, Heap});
    if (all_threads() > 1) b->Args({millions, all_threads(), Heap});
  }
  b->ArgNames({"Mparams", "threads", "heap"})->Unit(benchmark::kMillisecond)->UseRealTime();
}

// Registered from main: at static initialization registration order is not defined. The bounds
// and every heap:0 step first, then the heap:1 steps (use_heap).
void register_benchmarks() {
  benchmark::RegisterBenchmark("BM_CopyBandwidth", BM_CopyBandwidth)
      ->Apply(sizes_and_threads<0>)
      ->Iterations(1);
  for (auto* steps : {sizes_and_threads<0>, sizes_and_threads<1>}) {
    benchmark::RegisterBenchmark("BM_StreamBound", BM_StreamBound)
        ->Apply(steps)
        ->Iterations(kTimedSteps);
    benchmark::RegisterBenchmark("BM_FusedAdamW", BM_FusedAdamW)
        ->Apply(steps)
        ->Iterations(kTimedSteps);
    benchmark::RegisterBenchmark("BM_TensorOpsAdamW", BM_TensorOpsAdamW)
        ->Apply(steps)
        ->Iterations(kTimedSteps);
    benchmark::RegisterBenchmark("BM_TorchAdamWPlusCopy", BM_TorchAdamWPlusCopy)
        ->Apply(steps)
        ->Iterations(kTimedSteps);
  }
}

std::string load_average() {
  double load[3];
  if (getloadavg(load, 3) != 3) return "unknown";
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f %.2f %.2f", load[0], load[1], load[2]);
  return text;
}

void print_summary(const std::string& load_before) {
  const auto& medians = median_seconds();
  auto get = [&](const char* name, int64_t params, int threads, int heap, int clock) {
    auto it = medians.find({name, params, threads, heap, clock});
    return it == medians.end() ? std::nan("") : mixtrain::bench::median(it->second);
  };
  std::set<std::tuple<int64_t, int, int>> rows;
  for (const auto& [key, unused] : medians) {
    if (std::get<0>(key) != "copy_bound")
      rows.insert({std::get<1>(key), std::get<2>(key), std::get<3>(key)});
  }
  std::printf(
      "\nSummary: median of %d steps after %d warm-up steps (with repetitions, the median of "
      "their medians), ms; ratios of the same run. Load average before: %s, after: %s.\n"
      "heap: default = glibc's malloc (the baselines' temporaries mapped and first-touched every "
      "step); kept = freed memory kept in the heap (mallopt: temporaries pre-faulted, "
      "kernel vs kernel).\n\nWall time:\n"
      "| params | threads | heap | fused | (a) tensor ops | (b) torch AdamW + copy | (c) copy "
      "bound | stream bound | fused vs (a) | fused vs (b), target >= 5 | of (c), target %s | "
      "of stream bound |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      kTimedSteps, kWarmupSteps, load_before.c_str(), load_average().c_str(),
      ">= 0.85 (1 thread), >= 0.75 (all)");
  for (const auto& [params, threads, heap] : rows) {
    const double fused = get("fused", params, threads, heap, 0),
                 a = get("tensor_ops", params, threads, heap, 0),
                 b = get("torch_adamw", params, threads, heap, 0),
                 c = get("copy_bound", params, threads, heap, 0),
                 stream = get("stream", params, threads, heap, 0);
    std::printf(
        "| %lldM | %d | %s | %.2f | %.1f | %.1f | %.2f | %.2f | %.1fx | %.1fx | %.2f | %.2f |\n",
        static_cast<long long>(params >> 20), threads, heap == 0 ? "default" : "kept", fused * 1e3,
        a * 1e3, b * 1e3, c * 1e3, stream * 1e3, a / fused, b / fused, c / fused, stream / fused);
  }
  // On a machine other processes keep busy, wall time counts the time slices they take; CPU time
  // does not (it still counts page faults, as system time, and memory stalls). With several
  // threads it also counts OpenMP's spin-waiting, so read it for 1 thread.
  std::printf(
      "\nProcess CPU time (user + system, all threads):\n"
      "| params | threads | heap | fused | (a) tensor ops | (b) torch AdamW + copy | stream "
      "bound | fused vs (a) | fused vs (b) | of stream bound |\n|---|---|---|---|---|---|---|---|"
      "---|---|\n");
  for (const auto& [params, threads, heap] : rows) {
    const double fused = get("fused", params, threads, heap, 1),
                 a = get("tensor_ops", params, threads, heap, 1),
                 b = get("torch_adamw", params, threads, heap, 1),
                 stream = get("stream", params, threads, heap, 1);
    std::printf("| %lldM | %d | %s | %.2f | %.1f | %.1f | %.2f | %.1fx | %.1fx | %.2f |\n",
                static_cast<long long>(params >> 20), threads, heap == 0 ? "default" : "kept",
                fused * 1e3, a * 1e3, b * 1e3, stream * 1e3, a / fused, b / fused, stream / fused);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string load_before = load_average();
  register_benchmarks();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary(load_before);
  return 0;
}
