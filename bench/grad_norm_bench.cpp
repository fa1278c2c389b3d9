// Global gradient norm over ~16M elements (64 tensors of 256K, a small model's gradients):
// our global_grad_norm (vectorized kernel, dispatched on the CPU) and each kernel variant
// against what torch.nn.utils.clip_grad_norm_ does in ATen (at::norm per tensor, then the
// norm of the stacked norms). Reports bytes of gradient read per second.
//
//   build-*/bench_grad_norm_bench [--benchmark_filter=...]   (threads: OMP_NUM_THREADS)
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <vector>

#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/optim/grad_clip.h"
#include "mixtrain/optim/kernels/sum_of_squares_kernel.h"

namespace {

constexpr int64_t kTensors = 64;
constexpr int64_t kElementsPerTensor = 256 * 1024;  // 64 x 256K = 16M elements

std::vector<at::Tensor> make_grads(at::ScalarType dtype) {
  at::manual_seed(0);
  std::vector<at::Tensor> grads;
  for (int64_t i = 0; i < kTensors; ++i) grads.push_back(at::randn({kElementsPerTensor}).to(dtype));
  return grads;
}

at::ScalarType dtype_arg(const benchmark::State& state) {
  return state.range(0) == 0 ? at::kFloat : at::kBFloat16;
}

void set_counters(benchmark::State& state, const std::vector<at::Tensor>& grads) {
  state.SetBytesProcessed(state.iterations() * kTensors * kElementsPerTensor *
                          static_cast<int64_t>(grads[0].element_size()));
  state.SetLabel(at::toString(grads[0].scalar_type()));
}

void BM_MixtrainGlobalGradNorm(benchmark::State& state) {
  const auto grads = make_grads(dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(mixtrain::global_grad_norm(grads));
  set_counters(state, grads);
  state.counters["capability"] = static_cast<double>(mixtrain::cpu_capability());
}

// The kernel variant given by range(1): 0 = DEFAULT, 1 = AVX2, 2 = AVX512.
void BM_KernelVariant(benchmark::State& state) {
  using Kernel = double (*)(const mixtrain::SquaresBuffer*, int64_t);
  const Kernel kernels[] = {mixtrain::DEFAULT::sum_of_squares, mixtrain::AVX2::sum_of_squares,
                            mixtrain::AVX512::sum_of_squares};
  if (state.range(1) > static_cast<int64_t>(mixtrain::hardware_cpu_capability())) {
    state.SkipWithError("CPU lacks this capability");
    return;
  }
  const Kernel kernel = kernels[state.range(1)];
  const auto grads = make_grads(dtype_arg(state));
  std::vector<mixtrain::SquaresBuffer> buffers;
  for (const auto& g : grads) buffers.push_back({g.data_ptr(), g.numel(), g.scalar_type()});
  for (auto _ : state) {
    benchmark::DoNotOptimize(kernel(buffers.data(), static_cast<int64_t>(buffers.size())));
  }
  set_counters(state, grads);
}

// torch.nn.utils.clip_grad_norm_(norm_type=2): norm of the stacked per-tensor norms.
void BM_AtenNormPerTensor(benchmark::State& state) {
  const auto grads = make_grads(dtype_arg(state));
  for (auto _ : state) {
    std::vector<at::Tensor> norms;
    norms.reserve(grads.size());
    for (const auto& g : grads) norms.push_back(at::norm(g));
    benchmark::DoNotOptimize(at::stack(norms).norm().item<double>());
  }
  set_counters(state, grads);
}

// range(0): 0 = float32, 1 = bfloat16.
BENCHMARK(BM_MixtrainGlobalGradNorm)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_KernelVariant)
    ->ArgsProduct({{0, 1}, {0, 1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_AtenNormPerTensor)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
