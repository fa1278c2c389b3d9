// The GPU step's host synchronisations, counted by LibTorch itself (label cuda; skipped
// without a CUDA device): in sync debug mode (c10::cuda::warning_state(), as Python's
// torch.cuda.set_sync_debug_mode("warn")) every synchronising call (a blocking copy between
// host and device, .item(), a stream synchronise) raises a warning, which a handler here
// counts. The debug mode does not see a full device synchronise (train.profile's, off here)
// nor the caching allocator's. The CPU twin of this count, by site:
// gpu_step_host_reads_test.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mixtrain/core/device.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/trainer/trainer.h"
#include "support/trainer_probe.h"
#include "tools/cli_test_util.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::TempDir;

class SyncCounter : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("synchroniz") != std::string::npos) messages.push_back(warning.msg());
  }
  std::vector<std::string> messages;
};

// Synchronising calls in three unread steps after two warm-up steps, and in reading them.
struct Syncs {
  size_t steps = 0, read = 0;
};
Syncs count_syncs(const ResolvedConfig& config) {
  TempDir dir;
  DeviceMesh mesh = make_single_process_mesh();
  mesh.device = at::Device("cuda:0");
  Trainer trainer(config, mesh, dir.file("run"));
  trainer.step();
  trainer.step();
  SyncCounter counter;
  Syncs syncs;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&counter);
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
    std::vector<UnreadStepResult> unread;
    for (int i = 0; i < 3; ++i) unread.push_back(trainer.step_unread());
    syncs.steps = counter.messages.size();
    read_step_results(unread, mesh);
    syncs.read = counter.messages.size() - syncs.steps;
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
  for (const std::string& m : counter.messages) std::cout << "sync: " << m << "\n";
  return syncs;
}

// A dense bf16 model with fp32 main params and Muon + AdamW, clipping on: no synchronisation in
// three steps; one (the results' read) for all three.
TEST(GpuStepSync, DenseStepsDoNotSynchronise) {
  const ResolvedConfig config = load_config(
      MIXTRAIN_SOURCE_DIR "/configs/qwen2_tiny.yaml",
      {"model_init_dtype=bfloat16", "optimizer._target_=Muon", "optimizer.fp32_main_params=true",
       "fsdp_config.mix_precision.param_dtype=bfloat16", "data.seq_len=32",
       "data.micro_batch_size=2", "data.global_batch_size=4", "train.max_grad_norm=0.5"});
  const Syncs syncs = count_syncs(config);
  EXPECT_EQ(syncs.steps, 0u);
  EXPECT_EQ(syncs.read, 1u);
}

// The bf16 MoE model with expert dims that are multiples of 8: on a device with LibTorch's
// grouped GEMM (compute capability >= 9) the experts take the grouped form, whose group ends
// stay on the device: no synchronisation either. Elsewhere the loop form reads the tokens per
// expert once per layer and micro-batch (bincount on CUDA adds its own reads of the ids'
// range): bounded by 3 per layer and micro-batch.
TEST(GpuStepSync, MoeStepsDoNotSynchroniseWithTheGroupedExperts) {
  const ResolvedConfig config =
      test_support::checkpoint_test_config({"model.moe_intermediate_size=16"});
  const Syncs syncs = count_syncs(config);
  EXPECT_EQ(syncs.read, 1u);
  if (cuda_compute_capability_major(at::Device("cuda:0")) >= 9) {
    EXPECT_EQ(syncs.steps, 0u);
  } else {
    const size_t per_step = static_cast<size_t>(config.config.model.num_layers) * 4;
    EXPECT_LE(syncs.steps, 3 * 3 * per_step);
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
