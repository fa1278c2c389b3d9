// The mixed-precision AdamW step on a GPU, 1B float32 main params split into the tensors of a
// Llama-like model (hidden 2048, MLP 5632, vocabulary 32000, 18 layers: embedding and output
// matrices, four attention and three MLP matrices and two norms per layer, a final norm;
// 1.06e9 params in 165 tensors). Per step, timed with CUDA events on the current stream:
//   copy   a device-to-device copy of one float32 buffer of the params' size into another (the
//          HBM copy bandwidth: 8 bytes/param moved, read + written);
//   torch  ATen's multi-tensor fused AdamW (at::_fused_adamw_ on the float32 params, with the
//          state_steps increment torch.optim.AdamW(fused=True) makes before it), then the bf16
//          model params written from them with at::_foreach_copy_;
//   ours   mixtrain::AdamW::step() with bf16 copy-back targets: one multi-tensor pass.
// Bytes of the AdamW pass: reads p, g, m, v and writes p, m, v (float32) and the bf16 model
// param: 30 bytes/param. Reported: median ms of each (3 warm-up steps, then 20 timed, the three
// interleaved), the pass's achieved bandwidth (30 bytes/param / ours) as a fraction of the copy
// bandwidth (target >= 0.85), and torch / ours (target >= 1.5x).
//
//   bench_adamw_cuda_bench [--out results.json]
//
// Without a CUDA device it prints "skipped: no CUDA device" and exits 0.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_support.h"
#include "mixtrain/optim/adamw.h"

namespace {

constexpr int kWarmup = 3;
constexpr int kTimed = 20;
constexpr double kBytesPerParam = 30.0;
constexpr double kLr = 1e-4, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWeightDecay = 0.1;

std::vector<std::vector<int64_t>> model_shapes() {
  const int64_t hidden = 2048, mlp = 5632, vocab = 32000, layers = 18;
  std::vector<std::vector<int64_t>> shapes = {{vocab, hidden}};
  for (int64_t l = 0; l < layers; ++l) {
    for (int k = 0; k < 4; ++k) shapes.push_back({hidden, hidden});  // q, k, v, o
    shapes.push_back({mlp, hidden});                                 // gate
    shapes.push_back({mlp, hidden});                                 // up
    shapes.push_back({hidden, mlp});                                 // down
    shapes.push_back({hidden});                                      // two norms
    shapes.push_back({hidden});
  }
  shapes.push_back({hidden});  // final norm
  shapes.push_back({vocab, hidden});
  return shapes;
}

// Milliseconds of fn() on the current stream, between two CUDA events.
double time_ms(const std::function<void()>& fn) {
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  start.record(stream);
  fn();
  stop.record(stream);
  stop.synchronize();
  return static_cast<double>(start.elapsed_time(stop));
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--out" && i + 1 < argc) {
      out_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--out results.json]\n", argv[0]);
      return 2;
    }
  }
  if (torch::cuda::device_count() == 0) {
    std::printf("skipped: no CUDA device\n");
    return 0;
  }
  c10::NoGradGuard no_grad;
  const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  at::manual_seed(0);

  std::vector<at::Tensor> params, grads, models, exp_avgs, exp_avg_sqs, steps;
  int64_t numel = 0;
  for (const auto& shape : model_shapes()) {
    params.push_back((at::randn(shape, f32) * 0.02).requires_grad_(true));
    grads.push_back(at::randn(shape, f32) * 1e-3);
    models.push_back(params.back().to(at::kBFloat16));
    exp_avgs.push_back(at::zeros(shape, f32));  // torch's state; ours makes its own
    exp_avg_sqs.push_back(at::zeros(shape, f32));
    steps.push_back(at::zeros({}, f32));
    numel += params.back().numel();
  }
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i];
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(params);
  mixtrain::AdamW ours(
      std::move(groups),
      torch::optim::AdamWOptions(kLr).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(kWeightDecay));
  for (size_t i = 0; i < params.size(); ++i) ours.set_copy_back(params[i], models[i]);

  const at::Tensor copy_src = at::empty({numel}, f32).fill_(1.0f);
  const at::Tensor copy_dst = at::empty({numel}, f32);
  const auto copy = [&] { copy_dst.copy_(copy_src); };
  const auto torch_step = [&] {
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, kLr, kBeta1, kBeta2,
                      kWeightDecay, kEps, /*amsgrad=*/false, /*maximize=*/false);
    at::_foreach_copy_(models, params);
  };
  const auto our_step = [&] { ours.step(); };

  for (int i = 0; i < kWarmup; ++i) {
    copy();
    torch_step();
    our_step();
  }
  std::vector<double> copy_ms, torch_ms, our_ms;
  for (int i = 0; i < kTimed; ++i) {
    copy_ms.push_back(time_ms(copy));
    torch_ms.push_back(time_ms(torch_step));
    our_ms.push_back(time_ms(our_step));
  }
  const double copy_med = mixtrain::bench::median(copy_ms);
  const double torch_med = mixtrain::bench::median(torch_ms);
  const double our_med = mixtrain::bench::median(our_ms);
  const double copy_gbs = 8.0 * static_cast<double>(numel) / (copy_med * 1e6);
  const double our_gbs = kBytesPerParam * static_cast<double>(numel) / (our_med * 1e6);
  const double torch_gbs = kBytesPerParam * static_cast<double>(numel) / (torch_med * 1e6);

  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, c10::cuda::current_device());
  std::printf("device: %s\n", prop.name);
  std::printf("params: %lld in %zu tensors; %d timed steps (median), %d warm-up\n",
              static_cast<long long>(numel), params.size(), kTimed, kWarmup);
  std::printf("copy   (D2D, 8 B/param):            %8.3f ms  %7.1f GB/s\n", copy_med, copy_gbs);
  std::printf("torch  (_fused_adamw_ + bf16 copy): %8.3f ms  %7.1f GB/s at 30 B/param\n", torch_med,
              torch_gbs);
  std::printf("ours   (mixtrain::AdamW, one pass): %8.3f ms  %7.1f GB/s at 30 B/param\n", our_med,
              our_gbs);
  std::printf("ours of copy bandwidth: %.3f (target >= 0.85)\n", our_gbs / copy_gbs);
  std::printf("torch / ours: %.2fx (target >= 1.5x)\n", torch_med / our_med);

  const nlohmann::json result = {{"benchmark", "adamw_cuda_bench"},
                                 {"device", prop.name},
                                 {"params", numel},
                                 {"tensors", params.size()},
                                 {"timed_steps", kTimed},
                                 {"copy_ms", copy_med},
                                 {"copy_gb_per_s", copy_gbs},
                                 {"torch_fused_adamw_plus_copy_ms", torch_med},
                                 {"ours_ms", our_med},
                                 {"ours_gb_per_s", our_gbs},
                                 {"ours_of_copy_bandwidth", our_gbs / copy_gbs},
                                 {"torch_over_ours", torch_med / our_med}};
  if (!out_path.empty()) {
    std::ofstream out(out_path);
    out << result.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "adamw_cuda_bench: cannot write %s\n", out_path.c_str());
      return 1;
    }
  }
  return 0;
}
