// The GPU path against the CPU path (label cuda; skipped without a CUDA device), one process:
//  - a checkpoint saved by a GPU run restores on the CPU bit for bit (model params, main params,
//    optimizer state), and one saved on the CPU restores on the GPU bit for bit, through the
//    synchronous and the asynchronous (pinned-memory staging) save;
//  - the first training steps on the GPU match the CPU run within the tolerances stated below.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "mixtrain/distributed/device_mesh.h"
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
//  - main params after each step: 1e-3 relative to the largest element: the update is lr x an
//    orthogonalised (Muon, O(1)) or normalised (AdamW, O(1)) direction, lr <= 0.02, so even a
//    10% difference in a direction moves the params by 2e-3 x lr-scale; the initial params are
//    O(0.02-1).
// These bounds are argued, not yet measured on a GPU: the first device run reports the actual
// differences (printed below) and may tighten them.
TEST(DeviceCrossing, FirstStepsMatchTheCpuRun) {
  TempDir dir;
  const ResolvedConfig config =
      checkpoint_test_config({"optimizer.muon_config.muon_ns_dtype=float32"});
  Trainer cpu(config, mesh_on(at::kCPU), dir.file("cpu"));
  Trainer gpu(config, mesh_on(kGpu), dir.file("gpu"));
  expect_identical(whole_model_params(gpu), whole_model_params(cpu), "initial weights");
  for (int step = 1; step <= 3; ++step) {
    const auto want = as_map(recorded_step(cpu));
    const auto got = as_map(on_cpu(recorded_step(gpu)));
    const double loss = relative_difference(got.at("loss"), want.at("loss"));
    const double norm = relative_difference(got.at("grad_norm"), want.at("grad_norm"));
    double main = 0.0;
    for (const auto& [key, value] : want) {
      if (key.rfind("main.", 0) == 0)
        main = std::max(main, relative_difference(got.at(key), value));
    }
    std::cout << "step " << step << ": loss " << want.at("loss").item<double>() << " (cpu) vs "
              << got.at("loss").item<double>() << " (gpu), relative: loss " << loss
              << ", grad norm " << norm << ", main params " << main << std::endl;
    EXPECT_LE(loss, 5e-3) << "step " << step;
    EXPECT_LE(norm, 2e-2) << "step " << step;
    EXPECT_LE(main, 1e-3) << "step " << step;
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
