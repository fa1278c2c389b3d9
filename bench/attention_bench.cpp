// Causal GQA attention (model/attention.h), forward and forward + backward, with both kernels:
// kMath (HF's eager attention as tensor ops, what the model has always run) and kFlash
// (at::scaled_dot_product_attention, LibTorch's CPU flash-attention kernel), on the attention
// shapes of one micro-batch of
//   tiny: configs/qwen2_moe_tiny.yaml   batch 4, 4 heads, 2 kv heads, seq 64, head_dim 16;
//   41m:  bench_train_throughput's 41M  batch 2, 6 heads, 2 kv heads, seq 128, head_dim 64;
// in bfloat16 (both configs' model dtype), float32 (model_init_dtype's default) and float16,
// on 1 and 2 intra-op threads. q, k, v are transposed views of [B, S, heads, D] tensors, as the
// model passes them; the backward is autograd::grad (no .grad accumulation). One untimed call of
// each kernel first. The counters (medians per call, microseconds): math_us and flash_us wall
// time, math_cpu_us and flash_cpu_us process CPU time (all threads), and flash/math ratios; the
// Time column is the two calls together.
//
//   build/bench_attention_bench [--benchmark_filter=...] [--benchmark_repetitions=N]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <vector>

#include "mixtrain/model/attention.h"

namespace {

using mixtrain::AttentionKernel;

struct Shape {
  const char* name;
  int64_t batch, heads, kv_heads, seq, head_dim;
};
constexpr std::array<Shape, 2> kShapes = {{{"tiny", 4, 4, 2, 64, 16}, {"41m", 2, 6, 2, 128, 64}}};
constexpr std::array<at::ScalarType, 3> kDtypes = {at::kBFloat16, at::kFloat, at::kHalf};

struct Inputs {
  at::Tensor q, k, v, dout;
};

Inputs make_inputs(const Shape& s, at::ScalarType dtype) {
  at::manual_seed(0);
  auto draw = [&](int64_t heads) {
    return at::randn({s.batch, s.seq, heads, s.head_dim}).to(dtype).transpose(1, 2);
  };
  Inputs in{draw(s.heads), draw(s.kv_heads), draw(s.kv_heads), draw(s.heads).contiguous()};
  for (auto* t : {&in.q, &in.k, &in.v}) t->requires_grad_();
  return in;
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// range(0) shape, range(1) dtype, range(2) threads. Each iteration calls both kernels, in
// alternating order, and times each call on its own (wall and process CPU time, all threads), so
// the two see the same machine load; the counters are the medians over the iterations.
template <bool kBackward>
void time_attention(benchmark::State& state) {
  const Shape& shape = kShapes[state.range(0)];
  const at::ScalarType dtype = kDtypes[state.range(1)];
  at::set_num_threads(static_cast<int>(state.range(2)));
  const Inputs in = make_inputs(shape, dtype);
  auto call = [&](AttentionKernel kernel) {
    const at::Tensor out = mixtrain::causal_attention(in.q, in.k, in.v, kernel);
    if (kBackward) {
      benchmark::DoNotOptimize(torch::autograd::grad({out}, {in.q, in.k, in.v}, {in.dout}));
    }
    return out;
  };
  call(AttentionKernel::kMath);
  if (call(AttentionKernel::kFlash).grad_fn()->name().find("FlashAttention") == std::string::npos) {
    state.SkipWithError("at::scaled_dot_product_attention did not take the flash kernel");
    return;
  }
  std::array<std::vector<double>, 2> wall, cpu;  // [math, flash]
  bool flash_first = false;
  for (auto _ : state) {
    for (int i = 0; i < 2; ++i) {
      const int k = (i == 0) == flash_first ? 1 : 0;
      const auto kernel = k == 1 ? AttentionKernel::kFlash : AttentionKernel::kMath;
      const double cpu_start = process_cpu_seconds();
      const auto start = std::chrono::steady_clock::now();
      benchmark::DoNotOptimize(call(kernel));
      wall[k].push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      cpu[k].push_back(process_cpu_seconds() - cpu_start);
    }
    flash_first = !flash_first;
  }
  const double math_wall = median(wall[0]), flash_wall = median(wall[1]);
  const double math_cpu = median(cpu[0]), flash_cpu = median(cpu[1]);
  state.counters["math_us"] = 1e6 * math_wall;
  state.counters["flash_us"] = 1e6 * flash_wall;
  state.counters["flash/math"] = flash_wall / math_wall;
  state.counters["math_cpu_us"] = 1e6 * math_cpu;
  state.counters["flash_cpu_us"] = 1e6 * flash_cpu;
  state.counters["flash/math_cpu"] = flash_cpu / math_cpu;
  state.SetLabel(std::string(shape.name) + " " + at::toString(dtype));
}

void cases(benchmark::internal::Benchmark* b) {
  b->ArgsProduct({{0, 1}, {0, 1, 2}, {1, 2}})
      ->ArgNames({"shape", "dtype", "threads"})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

void BM_Forward(benchmark::State& state) {
  time_attention<false>(state);
}
void BM_ForwardBackward(benchmark::State& state) {
  time_attention<true>(state);
}

BENCHMARK(BM_Forward)->Apply(cases);
BENCHMARK(BM_ForwardBackward)->Apply(cases);

}  // namespace

BENCHMARK_MAIN();
