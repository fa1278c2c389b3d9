// Muon on CUDA tensors against the same on the CPU.
//
// What must be bitwise: everything elementwise. The momentum buffers (the fused pass's CUDA twin
// is bitwise the CPU AVX2/AVX-512 variant, muon_kernel_cuda_test), hence also the stacked u that
// Newton–Schulz reads, and the bf16 model param as the fp32 param rounded.
// What may differ: Newton–Schulz's output, only through the GEMMs' and the norm's summation order
// (cuBLAS's tiling and split-K against MKL/oneDNN's blocking). Tolerances, relative Frobenius
// ||O_gpu - O_cpu|| / ||O_cpu||, measured on the CPU by running the same iteration with the
// inner (summed) index of every GEMM permuted, i.e. the same sums in another order, for the
// shapes below (64x128, 96x48, 3x32x80, 256x512):
//   float32:  order changes O by 0.8e-6 - 1.9e-6, and O differs from a float64 run by as much.
//             Tolerance 1e-5 (5-10x): room for cuBLAS's split-K, tight enough that a TF32 GEMM
//             (10-bit mantissa, ~1e-3) or any wrong coefficient fails it.
//   bfloat16: order changes O by 2e-4 - 3e-3 (a sum on either side of a bf16 rounding boundary
//             flips one ulp, and the next step's GEMMs carry it on), against 5e-3 for bf16 vs a
//             float64 run. Tolerance 1.5e-2 (5x the largest): cuBLAS may also reduce split-K
//             partial sums in bf16 (LibTorch allows reduced-precision bf16 reductions by default),
//             one more rounding of the same size.
// And in both dtypes the GPU must be as accurate as the CPU against a float64 run (the
// iteration written out here), within 2x.
// (Measured in Python with torch on the CPU, the same op sequence.)
// A step must not synchronise with the host: it is captured into a CUDA graph
// (cudaStreamCaptureModeGlobal: a synchronising call during capture is an error) and the replay
// must equal the same step run eagerly, bitwise (same kernels and cuBLAS calls on one device).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/optim/muon.h"
#include "mixtrain/optim/newton_schulz.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

constexpr double kFloat32Tolerance = 1e-5;
constexpr double kBfloat16Tolerance = 1.5e-2;

double tolerance(at::ScalarType ns_dtype) {
  return ns_dtype == at::kFloat ? kFloat32Tolerance : kBfloat16Tolerance;
}

at::Tensor random_normal(at::IntArrayRef shape, uint64_t seed, double scale = 1.0) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen, at::kFloat) * scale;
}

double relative_frobenius(const at::Tensor& a, const at::Tensor& reference) {
  const at::Tensor r = reference.cpu().to(at::kDouble);
  return (a.cpu().to(at::kDouble) - r).norm().item<double>() / r.norm().item<double>();
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && at::equal(a.cpu(), b.cpu());
}

// ---- Newton–Schulz ----

// The iteration written out in float64 on the whole matrix (no transpose, no fused GEMMs), an
// independent float64 run of the same schedule (whose coefficients newton_schulz_test checks
// against the papers): X_0 = G / (||G||_F + eps); X <- a X + b (X X^T) X + c (X X^T)^2 X.
at::Tensor float64_iteration(const at::Tensor& g, const std::vector<NsCoefficients>& schedule) {
  at::Tensor x = g.to(at::kDouble);
  x = x / (at::linalg_vector_norm(x, 2, at::IntArrayRef({-2, -1}), true) + 1e-7);
  for (const auto& [a, b, c] : schedule) {
    const at::Tensor gram = at::matmul(x, x.transpose(-2, -1));
    x = a * x + b * at::matmul(gram, x) + c * at::matmul(at::matmul(gram, gram), x);
  }
  return x;
}

TEST(NewtonSchulzCuda, WithinSummationOrderOfTheCpuInBothDtypes) {
  const auto schedule = newton_schulz_schedule("asym5", 5, {});
  const std::vector<std::vector<int64_t>> shapes = {{64, 128}, {96, 48}, {3, 32, 80}, {256, 512}};
  for (const auto ns_dtype : {at::kFloat, at::kBFloat16}) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      SCOPED_TRACE(std::string(c10::toString(ns_dtype)) + " shape " +
                   c10::str(at::IntArrayRef(shapes[i])));
      // Exact in bf16, so every path starts from the same numbers.
      const at::Tensor g = random_normal(shapes[i], 500 + i).to(at::kBFloat16);
      const at::Tensor cpu = newton_schulz(g, schedule, 1e-7, ns_dtype);
      const at::Tensor gpu = newton_schulz(g.cuda(), schedule, 1e-7, ns_dtype);
      const at::Tensor exact = float64_iteration(g, schedule);
      ASSERT_TRUE(gpu.is_cuda());
      ASSERT_EQ(gpu.scalar_type(), ns_dtype);
      ASSERT_EQ(gpu.sizes(), g.sizes());
      EXPECT_LE(relative_frobenius(gpu, cpu), tolerance(ns_dtype));
      // As accurate as the CPU against float64, within 2x (float32: plus 2e-6, about as much
      // as the CPU's own error, which is a few roundings of the whole iteration).
      EXPECT_LE(relative_frobenius(gpu, exact),
                2 * relative_frobenius(cpu, exact) + (ns_dtype == at::kFloat ? 2e-6 : 0.0));
    }
  }
}

// ---- Muon steps ----

struct MuonRun {
  std::vector<at::Tensor> params, models;
  std::unique_ptr<Muon> muon;
};

// fp32 main params with bf16 model params (copy-back) on `device`: a wide and two tall matrices
// of one shape (one batched Newton–Schulz call) and a 3-D expert stack. Init std 0.02 keeps the
// params' ulp (~4e-9) far below the update differences the tolerance is about.
MuonRun make_run(c10::Device device, const MuonOptions& options) {
  const std::vector<std::vector<int64_t>> shapes = {{64, 128}, {96, 48}, {96, 48}, {3, 32, 80}};
  MuonRun run;
  for (size_t i = 0; i < shapes.size(); ++i) {
    run.params.push_back(random_normal(shapes[i], 600 + i, 0.02).to(device));
    run.models.push_back(run.params.back().to(at::kBFloat16));
  }
  run.muon = std::make_unique<Muon>(run.params, options);
  for (size_t i = 0; i < run.params.size(); ++i) {
    run.muon->set_copy_back(run.params[i], run.models[i]);
  }
  return run;
}

// The step's grads: float32, except bfloat16 on even steps (the fused pass widens them).
void set_grads(MuonRun& run, int step) {
  for (size_t i = 0; i < run.params.size(); ++i) {
    at::Tensor g = random_normal(run.params[i].sizes(), 700 + 10 * step + i);
    if (step % 2 == 0) g = g.to(at::kBFloat16);
    run.params[i].mutable_grad() = g.to(run.params[i].device());
  }
}

at::Tensor buffer(const MuonRun& run, size_t i) {
  return run.muon->export_state(run.params[i]).at(0).second;
}

// ulp of float32 at |x| (x normal).
double float_ulp(double x) {
  return std::ldexp(1.0, std::ilogb(x) - 23);
}

TEST(MuonCuda, StepsMatchTheCpuWithinNewtonSchulzTolerance) {
  if (cpu_capability() == CpuCapability::kDefault) {
    GTEST_SKIP() << "the CPU runs Muon's DEFAULT kernels (no FMA); the CUDA twins are the "
                    "AVX2/AVX-512 variants'";
  }
  const double lr = 0.02, wd = 0.1;
  for (const auto ns_dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto style : {MomentumStyle::kSum, MomentumStyle::kEma}) {
      SCOPED_TRACE(std::string(c10::toString(ns_dtype)) + " " + momentum_style_name(style));
      const MuonOptions options =
          MuonOptions().lr(lr).weight_decay(wd).momentum_style(style).ns_dtype(ns_dtype);
      MuonRun cpu = make_run(at::kCPU, options);
      MuonRun gpu = make_run(at::kCUDA, options);
      // Per param: the bound on ||p_gpu - p_cpu||_F so far.
      std::vector<double> bound(cpu.params.size(), 0.0);
      for (int step = 1; step <= 3; ++step) {
        std::vector<at::Tensor> before;
        for (const auto& p : cpu.params) before.push_back(p.to(at::kDouble));
        set_grads(cpu, step);
        set_grads(gpu, step);
        cpu.muon->step();
        gpu.muon->step();
        for (size_t i = 0; i < cpu.params.size(); ++i) {
          SCOPED_TRACE("param " + std::to_string(i) + " step " + std::to_string(step));
          EXPECT_TRUE(gpu.params[i].is_cuda());
          EXPECT_TRUE(bitwise_equal(buffer(gpu, i), buffer(cpu, i))) << "momentum buffer";
          EXPECT_TRUE(bitwise_equal(gpu.models[i], gpu.params[i].to(at::kBFloat16)))
              << "model param is not the main param rounded";
          // p = p * decay + alpha * O on both sides, decay <= 1: a difference carries over
          // at most as it was, and each step adds tol * ||alpha O|| (||alpha O||: the CPU's
          // update) plus one rounding of p per element.
          const at::Tensor p = cpu.params[i].to(at::kDouble);
          const double update = (p - before[i] * (1.0 - lr * wd)).norm().item<double>();
          const double rounding =
              std::sqrt(static_cast<double>(p.numel())) * float_ulp(p.abs().max().item<double>());
          bound[i] += tolerance(ns_dtype) * update + rounding;
          const double diff = (gpu.params[i].cpu().to(at::kDouble) - p).norm().item<double>();
          EXPECT_LE(diff, bound[i]) << "update norm " << update;
        }
      }
    }
  }
}

TEST(MuonCuda, StepIssuesNoHostSynchronisation) {
  const MuonOptions options = MuonOptions().lr(0.02).weight_decay(0.1);  // bf16 Newton–Schulz
  MuonRun eager = make_run(at::kCUDA, options);
  MuonRun graphed = make_run(at::kCUDA, options);
  // Their copies ran on the default stream; the side stream below does not wait for it.
  AT_CUDA_CHECK(cudaDeviceSynchronize());
  // Graphs are captured on a side stream; warm-up (state creation, cuBLAS handle and workspace)
  // and the eager reference run there too, so both see the same stream.
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  const c10::cuda::CUDAStreamGuard guard(side);
  for (MuonRun* run : {&eager, &graphed}) {
    set_grads(*run, 1);
    run->muon->step();
  }
  set_grads(eager, 2);
  eager.muon->step();

  set_grads(graphed, 2);
  at::cuda::CUDAGraph graph;
  graph.capture_begin({0, 0}, cudaStreamCaptureModeGlobal);
  graphed.muon->step();  // throws if anything in it synchronises
  graph.capture_end();
  graph.replay();
  AT_CUDA_CHECK(cudaStreamSynchronize(side));
  for (size_t i = 0; i < eager.params.size(); ++i) {
    SCOPED_TRACE("param " + std::to_string(i));
    EXPECT_TRUE(bitwise_equal(graphed.params[i], eager.params[i]));
    EXPECT_TRUE(bitwise_equal(graphed.models[i], eager.models[i]));
    EXPECT_TRUE(bitwise_equal(buffer(graphed, i), buffer(eager, i)));
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
