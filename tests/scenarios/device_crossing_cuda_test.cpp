// The GPU path against the CPU path (label cuda; skipped without a CUDA device), one process:
//  - a checkpoint saved by a GPU run restores on the CPU bit for bit (model params, main params,
//    optimizer state), and one saved on the CPU restores on the GPU bit for bit, through the
//    synchronous and the asynchronous (pinned-memory staging) save;
//  - the first training steps on the GPU match the CPU run within the tolerances stated below.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/muon_config.h"
#include "support/trainer_probe.h"
#include "tools/cli_test_util.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using test_support::as_map;
using test_support::checkpoint_test_config;
using test_support::recorded_step;
using test_support::relative_difference;
using test_support::whole_model_params;
using test_support::whole_optimizer_state;
using testing::TempDir;

const at::Device kGpu("cuda:0");

DeviceMesh mesh_on(at::Device device) {
  DeviceMesh mesh = make_single_process_mesh();
  mesh.device = device;
  return mesh;
}

// Every tensor on the CPU, bit for bit what it was.
NamedTensors on_cpu(const NamedTensors& tensors) {
  NamedTensors out;
  for (const auto& [key, t] : tensors) out.emplace_back(key, t.cpu());
  return out;
}

void expect_identical(const NamedTensors& actual, const NamedTensors& expected,
                      const std::string& what) {
  const auto a = as_map(on_cpu(actual));
  ASSERT_EQ(a.size(), expected.size()) << what;
  for (const auto& [key, want] : on_cpu(expected)) {
    ASSERT_TRUE(a.count(key)) << what << ": " << key;
    EXPECT_EQ(a.at(key).scalar_type(), want.scalar_type()) << what << ": " << key;
    EXPECT_TRUE(a.at(key).equal(want)) << what << ": " << key;
  }
}

// Trains `steps` on `from`, saves (sync or async), restores on `to`: every tensor of the
// restored trainer equals the saved one's.
void check_crossing(at::Device from, at::Device to, bool async) {
  TempDir dir;
  const std::string checkpoints = dir.file("checkpoints");
  const std::string mode = async ? "true" : "false";
  const ResolvedConfig saving =
      checkpoint_test_config({"checkpoint.dir=" + checkpoints, "checkpoint.async=" + mode});
  Trainer source(saving, mesh_on(from), dir.file("source"));
  source.step();
  source.step();
  source.save_checkpoint();
  source.wait_for_checkpoint();

  const ResolvedConfig restoring =
      checkpoint_test_config({"checkpoint.restore_from=" + checkpoints});
  Trainer restored(restoring, mesh_on(to), dir.file("restored"));
  ASSERT_EQ(restored.completed_steps(), 2);
  const std::string what = from.str() + " -> " + to.str() + (async ? " (async save)" : "");
  expect_identical(whole_model_params(restored), whole_model_params(source), what + " model");
  expect_identical(whole_optimizer_state(restored), whole_optimizer_state(source),
                   what + " optimizer state and main params");
  for (const auto& [key, t] : whole_model_params(restored)) {
    EXPECT_EQ(t.device(), to) << key;
  }
}

TEST(DeviceCrossing, GpuCheckpointRestoresOnCpuBitExact) {
  check_crossing(kGpu, at::kCPU, /*async=*/false);
  check_crossing(kGpu, at::kCPU, /*async=*/true);
}

TEST(DeviceCrossing, CpuCheckpointRestoresOnGpuBitExact) {
  check_crossing(at::kCPU, kGpu, /*async=*/false);
  check_crossing(at::kCPU, kGpu, /*async=*/true);
}

// The first steps of the same run (bfloat16 model, fp32 main params, Muon + AdamW) on both
// devices. The weights start identical (built on the CPU, then moved) and the tokens are the
// same; what differs is float summation order: cuBLAS and MKL accumulate each GEMM in float32
// in different orders, and every bfloat16 GEMM output is then rounded to 8 bits of mantissa
// (2^-9 relative), so an output near a rounding boundary can land one bf16 ulp (0.4%) apart.
// Newton-Schulz runs in float32 here (muon_ns_dtype), so it adds only float32 reordering.
//  - loss (a mean of 32 token losses): 5e-3 relative, about one bf16 ulp on every logit at
//    once, far more than the reordering of averaged terms gives;
//  - grad norm: 2e-2 relative: backward passes through more bf16 roundings than forward and the
//    norm is dominated by a few large gradients, so flips there do not average out;
//  - main params: in units of the parameter's own lr (eta; constant schedule, no warm-up), as
//    drift = |p_gpu - p_cpu| / eta per element. A relative bound cannot hold: AdamW's first step
//    is -eta * g / (|g| + eps) ~ -eta * sign(g), so a gradient element whose sign differs
//    between the devices (|g| within the reordering noise) moves 2 eta apart at once. So:
//    (1) ceiling: one step moves an element by at most U eta, U = 1.01 for AdamW (bias-corrected
//        m/sqrt(v) <= sqrt(sum a_i^2 / b_i) by Cauchy-Schwarz, with a_i, b_i the normalised
//        EMA weights: 1.0014 at step 2 and 1.0036 at step 3 with betas (0.9, 0.999); weight
//        decay adds eta * wd * |p| < 1e-3 eta) and
//        U = 1.2 * scale for Muon (Newton-Schulz leaves singular values below 1.2, so no entry
//        of O exceeds 1.2; scale = 0.2 sqrt(max(rows, cols)), adjust_lr_fn match_rms_adamw),
//        plus 1e-3 for the float32 arithmetic: drift <= 2 t U + 1e-3 after step t, as each
//        device moves at most U per step;
//    (2) at step 1 every AdamW element that drifts by more than 0.1 eta is explained: its
//        gradient's sign differs between the devices, or |g| < 100 eps (there g / (|g| + eps)
//        is not +-1); counted and printed;
//    (3) tail: elements with drift > 0.1 eta are at most 1% of all main-param elements (plus
//        2): a sign flip needs |g| within ~0.4% (one bf16 ulp) of the gradient's scale of zero,
//        which a smooth gradient distribution puts at ~0.3% of its elements; Muon's O is a
//        smooth function of the momentum away from near-singular matrices.
// These bounds are argued, not yet measured on a GPU: the first device run reports the actual
// differences (printed below) and may tighten them.
TEST(DeviceCrossing, FirstStepsMatchTheCpuRun) {
  TempDir dir;
  const ResolvedConfig config =
      checkpoint_test_config({"optimizer.muon_config.muon_ns_dtype=float32"});
  // The assumptions of bound (1).
  ASSERT_EQ(muon_config(config.config).options.adjust_lr_fn(), AdjustLrFn::kMatchRmsAdamw);
  ASSERT_EQ(muon_config(config.config).options.matched_adamw_rms(), 0.2);
  ASSERT_EQ(std::get<0>(adamw_config(config.config).betas()), 0.9);
  ASSERT_EQ(std::get<1>(adamw_config(config.config).betas()), 0.999);
  Trainer cpu(config, mesh_on(at::kCPU), dir.file("cpu"));
  Trainer gpu(config, mesh_on(kGpu), dir.file("gpu"));
  expect_identical(whole_model_params(gpu), whole_model_params(cpu), "initial weights");
  ChainedOptimizer& chained = cpu.optimizer().chained();
  const double adamw_eps = adamw_config(config.config).eps();
  for (int step = 1; step <= 3; ++step) {
    const auto want = as_map(recorded_step(cpu));
    const auto got = as_map(on_cpu(recorded_step(gpu)));
    const double loss = relative_difference(got.at("loss"), want.at("loss"));
    const double norm = relative_difference(got.at("grad_norm"), want.at("grad_norm"));
    int64_t elements = 0, tail = 0, unexplained = 0;
    double worst = 0.0;
    for (const std::string& name : chained.names()) {
      SCOPED_TRACE("step " + std::to_string(step) + ": " + name);
      const at::Tensor p_cpu = want.at("main." + name), p_gpu = got.at("main." + name);
      const bool muon = chained.leaf_of(name).kind() == "muon";
      const double eta =
          muon ? muon_config(config.config).options.lr() : adamw_config(config.config).lr();
      const double per_step =
          muon
              ? 1.2 * 0.2 * std::sqrt(static_cast<double>(std::max(p_cpu.size(-2), p_cpu.size(-1))))
              : 1.01;
      const at::Tensor drift = (p_gpu.to(at::kDouble) - p_cpu.to(at::kDouble)).abs() / eta;
      const double most = drift.max().item<double>();
      worst = std::max(worst, most);
      EXPECT_LE(most, 2 * step * per_step + 1e-3) << "ceiling (1)";
      const at::Tensor large = drift > 0.1;
      elements += drift.numel();
      tail += large.sum().item<int64_t>();
      if (step == 1 && !muon) {
        const at::Tensor g_cpu = want.at("grad." + name), g_gpu = got.at("grad." + name);
        const at::Tensor explained =
            (g_cpu.sign() != g_gpu.sign()) | (g_cpu.abs() < 100 * adamw_eps);
        unexplained += (large & ~explained).sum().item<int64_t>();
      }
    }
    std::cout << "step " << step << ": loss " << want.at("loss").item<double>() << " (cpu) vs "
              << got.at("loss").item<double>() << " (gpu), relative: loss " << loss
              << ", grad norm " << norm << "; main params: largest drift " << worst << " lr, "
              << tail << " of " << elements << " elements beyond 0.1 lr"
              << (step == 1 ? ", " + std::to_string(unexplained) + " not a sign flip" : "")
              << std::endl;
    EXPECT_LE(loss, 5e-3) << "step " << step;
    EXPECT_LE(norm, 2e-2) << "step " << step;
    EXPECT_EQ(unexplained, 0) << "step " << step << ": (2)";
    EXPECT_LE(tail, elements / 100 + 2) << "step " << step << ": tail (3)";
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
