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
#include "support/multiprocess.h"
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
// step, clipping on.
ResolvedConfig dense_config(std::vector<std::string> more = {}) {
  std::vector<std::string> overrides = {"model_init_dtype=bfloat16",
                                        "optimizer._target_=Muon",
                                        "optimizer.fp32_main_params=true",
                                        "fsdp_config.mix_precision.param_dtype=bfloat16",
                                        "data.seq_len=16",
                                        "data.micro_batch_size=2",
                                        "data.global_batch_size=4",
                                        "train.max_grad_norm=0.5"};
  overrides.insert(overrides.end(), more.begin(), more.end());
  return load_config(MIXTRAIN_SOURCE_DIR "/configs/qwen2_tiny.yaml", overrides);
}

// No read in three steps; one for their results.
TEST(GpuStepHostReads, DenseStepsReadNothingUntilTheirResultsAreRead) {
  const Counted counted = count_reads(dense_config());
  EXPECT_EQ(counted.steps.total, 0) << ::testing::PrintToString(counted.steps.by_site);
  EXPECT_EQ(counted.read.total, 1);
  EXPECT_EQ(counted.read.by_site, (std::map<std::string, int64_t>{{"step results", 1}}));
}

// float16 with dynamic loss scaling: whether to step is the host's decision, one read of the
// found-inf flag per step (unscaled and flagged on the device, the flag reduced there).
TEST(GpuStepHostReads, Float16StepsReadOnlyTheFoundInfFlag) {
  const Counted counted = count_reads(
      dense_config({"model_init_dtype=float16", "fsdp_config.mix_precision.param_dtype=float16"}));
  EXPECT_EQ(counted.steps.by_site, (std::map<std::string, int64_t>{{"loss scaler: found inf", 3}}));
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

// The same model with FSDP over 2 processes: the sharded Muon path, the placed clip (its sums
// all-reduced over dp_shard) and the loss all-reduce of the read. Distributed Muon's
// parameter-count check reads on its first step only (and when a rank's count changes).
MIXTRAIN_WORKER(fsdp_host_reads) {
  const DeviceMesh mesh = worker.make_mesh();
  const std::string dtype = worker.get("DTYPE", "bfloat16");
  Trainer trainer(
      dense_config({"parallel.dp_shard=2", "data.global_batch_size=8", "model_init_dtype=" + dtype,
                    "fsdp_config.mix_precision.param_dtype=" + dtype}),
      mesh, (worker.dir / ("run" + std::to_string(worker.rank.rank))).string());
  trainer.step();
  trainer.step();
  reset_host_reads();
  std::vector<UnreadStepResult> unread;
  for (int i = 0; i < 3; ++i) unread.push_back(trainer.step_unread());
  // float16: the found-inf flag, reduced over dp_shard on the device, read once per step.
  const std::map<std::string, int64_t> expected =
      dtype == "float16" ? std::map<std::string, int64_t>{{"loss scaler: found inf", 3}}
                         : std::map<std::string, int64_t>{};
  EXPECT_EQ(host_reads().by_site, expected);
  reset_host_reads();
  const std::vector<StepResult> results = read_step_results(unread, mesh);
  EXPECT_EQ(host_reads().by_site, (std::map<std::string, int64_t>{{"step results", 1}}));
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[2].step, 5);
}

TEST(GpuStepHostReads, FsdpStepsReadNothingUntilTheirResultsAreRead) {
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  for (const char* dtype : {"bfloat16", "float16"}) {
    const testing::WorkerResult result =
        testing::run_workers("fsdp_host_reads", 2, parallel, {{"DTYPE", dtype}});
    EXPECT_TRUE(result.all_ok()) << dtype << ": " << result.summary();
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
