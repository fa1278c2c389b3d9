// One AdamW step over 16M float32 params that also writes the bfloat16 model params:
//   BM_FusedAdamW           mixtrain::AdamW with a bf16 copy-back target (one fused pass);
//   BM_TorchAdamWPlusCopy   torch::optim::AdamW, then model.copy_(param) (the unfused way);
//   BM_StreamBound          the same memory traffic with no arithmetic to speak of: reads p, g,
//                           m, v, writes p, m, v and a 16-bit copy of p, vectorized and split
//                           like the kernel. Its time is the memory-bandwidth bound.
// Bytes per param: 4 reads + 3 writes of float32 + one bf16 write = 30. Each benchmark reports
// GB/s at 30 bytes/param and its fraction of the bound (bound time / its time) at the same
// thread count (the argument).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>

#include "mixtrain/optim/adamw.h"

namespace {

constexpr int64_t kParams = int64_t{16} << 20;
constexpr double kBytesPerParam = 30.0;
constexpr int64_t kChunk = int64_t{1} << 16;

using Clock = std::chrono::steady_clock;

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

struct StreamBuffers {
  at::Tensor p = at::zeros({kParams}), g = at::full({kParams}, 1e-30f), m = at::zeros({kParams}),
             v = at::zeros({kParams}), out = at::zeros({kParams}, at::kShort);
  void pass() {
    stream_pass(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                reinterpret_cast<uint16_t*>(out.data_ptr<int16_t>()), kParams);
  }
};

// Seconds per stream pass at `threads` threads: the best of several passes, measured once.
double bound_seconds(int threads) {
  static std::map<int, double> cache;
  auto it = cache.find(threads);
  if (it != cache.end()) return it->second;
  at::set_num_threads(threads);
  StreamBuffers buffers;
  buffers.pass();  // first touch
  double best = 1e9;
  for (int k = 0; k < 10; ++k) {
    const auto start = Clock::now();
    buffers.pass();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return cache[threads] = best;
}

void report(benchmark::State& state, double seconds_total, int threads) {
  const double per_step = seconds_total / static_cast<double>(state.iterations());
  state.counters["GB/s"] = kBytesPerParam * kParams / per_step / 1e9;
  state.counters["of_bound"] = bound_seconds(threads) / per_step;
}

void BM_FusedAdamW(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  bound_seconds(threads);
  at::set_num_threads(threads);
  at::manual_seed(0);
  at::Tensor param = at::randn({kParams}).requires_grad_(true);
  at::Tensor model = param.detach().to(at::kBFloat16);
  param.mutable_grad() = at::randn({kParams});
  mixtrain::AdamW optimizer({torch::optim::OptimizerParamGroup({param})});
  optimizer.set_copy_back(param, model);
  optimizer.step();  // creates the state
  double seconds = 0;
  for (auto _ : state) {
    const auto start = Clock::now();
    optimizer.step();
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  report(state, seconds, threads);
}

void BM_TorchAdamWPlusCopy(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  bound_seconds(threads);
  at::set_num_threads(threads);
  at::manual_seed(0);
  at::Tensor param = at::randn({kParams}).requires_grad_(true);
  at::Tensor model = param.detach().to(at::kBFloat16);
  param.mutable_grad() = at::randn({kParams});
  torch::optim::AdamW optimizer({torch::optim::OptimizerParamGroup({param})});
  auto step = [&] {
    optimizer.step();
    at::NoGradGuard no_grad;
    model.copy_(param);
  };
  step();
  double seconds = 0;
  for (auto _ : state) {
    const auto start = Clock::now();
    step();
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  report(state, seconds, threads);
}

void BM_StreamBound(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  at::set_num_threads(threads);
  StreamBuffers buffers;
  buffers.pass();
  double seconds = 0;
  for (auto _ : state) {
    const auto start = Clock::now();
    buffers.pass();
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  report(state, seconds, threads);
}

BENCHMARK(BM_FusedAdamW)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TorchAdamWPlusCopy)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_StreamBound)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
