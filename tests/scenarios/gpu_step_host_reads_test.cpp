// The training step's host reads (core/host_sync.h), counted on the CPU. A GPU step runs the
// same code with the same counted read sites (only the grad-norm clip has a device form, whose
// arithmetic grad_clip_cuda_test checks against the host form), so these counts are a GPU
// step's host synchronisations: between log steps none; the results of any number of steps
// are read at once, in one read. MoE layers on the CPU take the loop form of
// model/routed_experts.h, which sizes each expert's GEMM on the host: one read of the tokens
// per expert per layer and micro-batch, counted exactly here so that it cannot grow unnoticed
// (on a GPU with LibTorch's grouped GEMM the grouped form makes none: routed_experts_test).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "mixtrain/core/host_sync.h"
#include "mixtrain/distributed/device_mesh.h"
#include "support/trainer_probe.h"
#include "tools/cli_test_util.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::TempDir;

// Runs 2 steps (the first creates the optimizer state, the caches fill), then 3 unread steps
// (what run_training does between log steps), then reads them. Returns the reads of the 3
// steps and of the read; checks that the deferred results are the ones step() reads at once.
struct Counted {
  HostReads steps, read;
};
Counted count_reads(const ResolvedConfig& config) {
  TempDir dir;
  const DeviceMesh mesh = make_single_process_mesh();
  Trainer deferred(config, mesh, dir.file("deferred"));
  Trainer at_once(config, make_single_process_mesh(), dir.file("at_once"));
  for (int i = 0; i < 2; ++i) {
    deferred.step();
    at_once.step();
  }
  reset_host_reads();
  std::vector<UnreadStepResult> unread;
  for (int i = 0; i < 3; ++i) unread.push_back(deferred.step_unread());
  Counted counted;
  counted.steps = host_reads();
  reset_host_reads();
  const std::vector<StepResult> results = read_step_results(unread, mesh);
  counted.read = host_reads();
  EXPECT_EQ(results.size(), 3u);
  for (size_t i = 0; i < results.size(); ++i) {
    const StepResult want = at_once.step();
    EXPECT_EQ(results[i].step, want.step);
    EXPECT_EQ(results[i].loss, want.loss) << "step " << want.step;  // the same bits
    EXPECT_EQ(results[i].aux_loss, want.aux_loss) << "step " << want.step;
    EXPECT_EQ(results[i].grad_norm, want.grad_norm) << "step " << want.step;
    EXPECT_EQ(results[i].lr, want.lr) << "step " << want.step;
  }
  return counted;
}

// A dense bf16 model (Qwen2) with fp32 main params and Muon + AdamW, two micro-batches per
// step, clipping on: no read in three steps; one for their results.
TEST(GpuStepHostReads, DenseStepsReadNothingUntilTheirResultsAreRead) {
  const ResolvedConfig config = load_config(
      MIXTRAIN_SOURCE_DIR "/configs/qwen2_tiny.yaml",
      {"model_init_dtype=bfloat16", "optimizer._target_=Muon", "optimizer.fp32_main_params=true",
       "fsdp_config.mix_precision.param_dtype=bfloat16", "data.seq_len=16",
       "data.micro_batch_size=2", "data.global_batch_size=4", "train.max_grad_norm=0.5"});
  const Counted counted = count_reads(config);
  EXPECT_EQ(counted.steps.total, 0) << ::testing::PrintToString(counted.steps.by_site);
  EXPECT_EQ(counted.read.total, 1);
  EXPECT_EQ(counted.read.by_site, (std::map<std::string, int64_t>{{"step results", 1}}));
}

// The bf16 MoE model with fp32 main params and Muon + AdamW (configs/qwen2_moe_tiny.yaml,
// shrunk; 4 micro-batches of 1): the only reads are the MoE dispatch's, num_layers x micro-batches
// per step.
TEST(GpuStepHostReads, MoeStepsReadOnlyTheTokensPerExpert) {
  const ResolvedConfig config = test_support::checkpoint_test_config({"train.max_grad_norm=1.0"});
  const int64_t per_step = config.config.model.num_layers * 4;
  const Counted counted = count_reads(config);
  EXPECT_EQ(counted.steps.by_site,
            (std::map<std::string, int64_t>{{"moe: tokens per expert", 3 * per_step}}));
  EXPECT_EQ(counted.read.by_site, (std::map<std::string, int64_t>{{"step results", 1}}));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
