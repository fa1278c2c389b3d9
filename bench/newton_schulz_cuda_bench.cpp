// Muon's Newton–Schulz on a CUDA device (optim/newton_schulz.h: 5 asym5 steps in bfloat16)
// against the GEMM rate of the same device, on the Muon shapes of issue 15: one 4096x4096 matrix
// and a stack of 8 experts of 1408x4096.
//
//   newton_schulz   the library's newton_schulz() on the bf16 stack Muon hands it (normalisation,
//                   5 x (bmm, baddbmm, baddbmm), the baddbmm's copies of their self operand);
//   gemm            the same sequence of cuBLAS bf16 GEMMs of the same shapes done directly, per
//                   step X X^T, A A, P X with at::mm (one matrix) or at::bmm (the stack), on
//                   tensors prepared outside the timing: the GEMM rate.
// TFLOP/s for both at the GEMMs' FLOP count, 5 x (4 m^2 n + 2 m^3) per matrix (m = min(rows,
// cols), n = max); of_gemm_rate = gemm time / newton_schulz time (target >= 0.85).
// Timing: CUDA events around --reps back-to-back calls (launch gaps included), after --warmup
// calls; the best of 3 such loops. Writes JSON to --out PATH (default stdout only).
// Without a CUDA device: prints "skipped: no CUDA device" (and writes it as the JSON's
// "skipped") and exits 0.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_support.h"
#include "mixtrain/optim/newton_schulz.h"

namespace {

using mixtrain::bench::fail;

struct Shape {
  const char* name;
  int64_t batch, rows, cols;
};
const Shape kShapes[] = {{"4096x4096", 1, 4096, 4096}, {"8x1408x4096 experts", 8, 1408, 4096}};
constexpr int kSteps = 5;
constexpr double kTarget = 0.85;

struct Options {
  std::string out;
  int reps = 20;
  int warmup = 3;
};

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] { return mixtrain::bench::option_value(argc, argv, i); };
    if (arg == "--out") {
      options.out = value();
    } else if (arg == "--reps") {
      options.reps = std::atoi(value().c_str());
      if (options.reps < 1) fail("--reps must be >= 1");
    } else if (arg == "--warmup") {
      options.warmup = std::atoi(value().c_str());
      if (options.warmup < 0) fail("--warmup must be >= 0");
    } else if (arg == "-h" || arg == "--help") {
      std::printf(
          "usage: %s [--out PATH] [--reps N] [--warmup N]\n"
          "Newton-Schulz (5 asym5 steps, bf16) on a CUDA device vs the same cuBLAS bf16 GEMMs\n"
          "alone, for 4096x4096 and 8x1408x4096; JSON to PATH.\n",
          argv[0]);
      std::exit(0);
    } else {
      fail("unknown argument " + arg + " (see --help)");
    }
  }
  return options;
}

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(error));
}

// Milliseconds per call of f: CUDA events around `reps` calls on the current stream, best of 3.
template <typename F>
double time_ms(const Options& options, F&& f) {
  for (int i = 0; i < options.warmup; ++i) f();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  double best = 1e30;
  for (int loop = 0; loop < 3; ++loop) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int i = 0; i < options.reps; ++i) f();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    best = std::min(best, static_cast<double>(ms) / options.reps);
  }
  check(cudaEventDestroy(start), "cudaEventDestroy");
  check(cudaEventDestroy(stop), "cudaEventDestroy");
  return best;
}

double flops(const Shape& s) {
  const double m = std::min(s.rows, s.cols), n = std::max(s.rows, s.cols);
  return kSteps * s.batch * (4 * m * m * n + 2 * m * m * m);
}

nlohmann::json measure(const Options& options, const Shape& s) {
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::manual_seed(0);
  const at::Tensor g = at::randn({s.batch, s.rows, s.cols}, cuda).to(at::kBFloat16);
  const auto schedule = mixtrain::newton_schulz_schedule("asym5", kSteps, {});
  const at::Tensor input = s.batch == 1 ? g[0] : g;  // one matrix as Muon holds it: 2-D
  const double ns_ms =
      time_ms(options, [&] { mixtrain::newton_schulz(input, schedule, 1e-7, at::kBFloat16); });

  // The GEMMs alone: X (m x n, normalised), A = X X^T, P (m x m) prepared once.
  at::Tensor x = g.size(1) > g.size(2) ? g.transpose(1, 2).contiguous() : g;
  x = x /
      at::linalg_vector_norm(x.to(at::kFloat), 2, at::IntArrayRef({1, 2}), true).to(at::kBFloat16);
  const at::Tensor a = at::bmm(x, x.transpose(1, 2));
  const at::Tensor p = at::bmm(a, a);
  const double gemm_ms = time_ms(options, [&] {
    for (int step = 0; step < kSteps; ++step) {
      if (s.batch == 1) {
        at::mm(x[0], x[0].t());
        at::mm(a[0], a[0]);
        at::mm(p[0], x[0]);
      } else {
        at::bmm(x, x.transpose(1, 2));
        at::bmm(a, a);
        at::bmm(p, x);
      }
    }
  });

  const double tflop = flops(s) / 1e12;
  const double ratio = gemm_ms / ns_ms;
  std::printf(
      "%-20s newton_schulz %8.3f ms %7.1f TFLOP/s | gemm %8.3f ms %7.1f TFLOP/s | "
      "of GEMM rate %.3f (target >= %.2f: %s)\n",
      s.name, ns_ms, tflop / (ns_ms / 1e3), gemm_ms, tflop / (gemm_ms / 1e3), ratio, kTarget,
      ratio >= kTarget ? "met" : "NOT met");
  return {{"shape", s.name},
          {"batch", s.batch},
          {"rows", s.rows},
          {"cols", s.cols},
          {"tflop_per_call", tflop},
          {"newton_schulz_ms", ns_ms},
          {"newton_schulz_tflops", tflop / (ns_ms / 1e3)},
          {"gemm_ms", gemm_ms},
          {"gemm_tflops", tflop / (gemm_ms / 1e3)},
          {"of_gemm_rate", ratio},
          {"target", kTarget},
          {"met", ratio >= kTarget}};
}

}  // namespace

int main(int argc, char** argv) {
  mixtrain::bench::program_name() = "bench_newton_schulz_cuda_bench";
  const Options options = parse_options(argc, argv);
  if (c10::cuda::device_count() == 0) {
    std::printf("skipped: no CUDA device\n");
    if (!options.out.empty()) {
      std::ofstream out(options.out);
      out << nlohmann::json{{"benchmark", "newton_schulz_cuda_bench"},
                            {"skipped", "no CUDA device"}}
                 .dump(2)
          << "\n";
    }
    return 0;
  }
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  std::printf("device: %s; asym5, %d steps, bfloat16; %d calls per loop, best of 3 loops\n",
              props->name, kSteps, options.reps);
  nlohmann::json results = nlohmann::json::array();
  for (const Shape& s : kShapes) results.push_back(measure(options, s));
  const nlohmann::json report = {{"benchmark", "newton_schulz_cuda_bench"},
                                 {"device", props->name},
                                 {"ns_variant", "asym5"},
                                 {"ns_steps", kSteps},
                                 {"dtype", "bfloat16"},
                                 {"reps", options.reps},
                                 {"results", results}};
  if (!options.out.empty()) {
    std::ofstream out(options.out);
    out << report.dump(2) << "\n";
    if (!out) fail("cannot write " + options.out);
  }
  return 0;
}
