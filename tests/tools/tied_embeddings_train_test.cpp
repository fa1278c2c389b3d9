// Tied embeddings (model.tie_word_embeddings) through `mixtrain train`: every parallel layout
// against one process on the same global batch -- FSDP, tensor and context parallelism on the
// dense qwen2, expert parallelism on qwen3_moe -- the checkpoint holds the shared matrix once
// (model.model.embed_tokens.weight, no model.lm_head.weight), and a run restored from a
// checkpoint continues exactly like one run on two FSDP ranks; and, in worker processes of this
// binary driving a Trainer step by step, the gradient norm and every parameter's gradient of every
// step of the FSDP, DDP (dp_replicate), tensor and context parallel layouts against one process
// (the loss alone would not show a gradient doubled or left unaveraged: the clip and AdamW's
// sign-like first update hide a uniform scale). The model-level parity with
// transformers is tests/unit/model/qwen2_test.cpp / qwen2_moe_test.cpp; HF in and out,
// tests/tools/export_hf_command_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "mixtrain/core/safetensors.h"
#include "support/multiprocess.h"
#include "support/train_then_resume.h"
#include "support/trainer_probe.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

// configs/qwen2_tiny.yaml (float32, AdamW) tied, constant LR, global batch 8 of 32 tokens.
std::string dense_command(const std::string& run_dir) {
  return "train --config " + source_path("configs/qwen2_tiny.yaml") +
         " --set model.tie_word_embeddings=true" +
         " --set train.lr_scheduler.warmup_steps=0 --set train.lr_scheduler.decay=constant" +
         " --set data.seq_len=32 --set data.micro_batch_size=4 --run-dir " + run_dir;
}

// configs/qwen3_moe_tiny.yaml tied, in float32 (model, compute, Newton-Schulz), so that layouts
// differ by float32 summation order only.
std::string moe_command(const std::string& run_dir) {
  return "train --config " + source_path("configs/qwen3_moe_tiny.yaml") +
         " --set model.tie_word_embeddings=true --set model_init_dtype=float32" +
         " --set optimizer.fp32_main_params=false" +
         " --set fsdp_config.mix_precision.param_dtype=float32" +
         " --set fsdp_config.mix_precision.output_dtype=float32" +
         " --set optimizer.muon_config.muon_ns_dtype=float32" +
         " --set train.lr_scheduler.warmup_steps=0 --set train.lr_scheduler.decay=constant" +
         " --set data.seq_len=32 --set data.micro_batch_size=4 --set data.global_batch_size=8" +
         " --run-dir " + run_dir;
}

// Runs `layout` and one process for 2 steps and compares their losses and gradient norms.
// float32 throughout; the layouts differ from one process only in float32 summation order (ranks'
// halves of the batch, the tp vocabulary split of the cross-entropy, the cp ring's merged
// attention, the experts' token exchange: 2^-24 per addition over a few thousand terms), so 1e-5
// relative, as tests/tools/qwen2_train_test.cpp; a head that did not share the embedding, or a
// gradient counted once or twice too often, moves the second step's loss by far more (the first
// update changes every logit). The gradient norm: 1e-5 relative at step 1 (the same parameters;
// measured <= 3.6e-6, expert parallelism), 1e-4 at step 2, after an update that amplifies those
// roundings (AdamW and Muon normalise each update: a gradient element within rounding of zero
// may move its parameter by up to the learning rate; measured up to 1.7e-5 with expert
// parallelism); a gradient doubled or not averaged doubles it (or halves it), with AdamW's first
// update and the clip hiding that from the loss.
void expect_layout_matches_one_process(const std::function<std::string(const std::string&)>& cmd,
                                       const std::string& layout, const std::string& label) {
  TempDir run;
  const std::string steps = " --set train.steps=2";
  const CommandResult many = run_mixtrain(cmd(run.file("many")) + steps + " " + layout);
  ASSERT_EQ(many.exit_code, 0) << label << "\n" << many.output;
  const CommandResult one = run_mixtrain(cmd(run.file("one")) + steps);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto a = read_metrics(run.file("many/metrics.jsonl"));
  const auto b = read_metrics(run.file("one/metrics.jsonl"));
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(a[i]["loss"].get<double>(), b[i]["loss"].get<double>(),
                1e-5 * b[i]["loss"].get<double>())
        << label << ", step " << i + 1;
    EXPECT_NEAR(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>(),
                (i == 0 ? 1e-5 : 1e-4) * b[i]["grad_norm"].get<double>())
        << label << ", step " << i + 1 << ": grad norm";
  }
  std::printf("%s: step 2 loss %.6f (one process %.6f); grad norms %.9g, %.9g (%.9g, %.9g)\n",
              label.c_str(), a[1]["loss"].get<double>(), b[1]["loss"].get<double>(),
              a[0]["grad_norm"].get<double>(), a[1]["grad_norm"].get<double>(),
              b[0]["grad_norm"].get<double>(), b[1]["grad_norm"].get<double>());
}

TEST(TiedEmbeddingsTrain, FsdpTensorAndContextParallelMatchOneProcess) {
  expect_layout_matches_one_process(dense_command, "--nproc 2 --set parallel.dp_shard=2", "FSDP 2");
  expect_layout_matches_one_process(
      dense_command, "--nproc 2 --set parallel.dp_shard=1 --set parallel.tp=2", "TP 2");
  expect_layout_matches_one_process(
      dense_command, "--nproc 2 --set parallel.dp_shard=1 --set parallel.cp=2", "CP 2");
}

// Steps each layout records (TiedEmbeddingsTrain.EveryStepsGradientMatchesOneProcess).
constexpr int kRecordedSteps = 3;

// The dense tied model of dense_command in a Trainer on worker.parallel's layout, without
// gradient clipping (so the recorded gradients are the reduced ones, not scaled down to norm 1
// whatever their scale): kRecordedSteps steps, each recorded (support/trainer_probe.h: loss, grad
// norm, every parameter's gradient, main and model params after the update, gathered to whole
// tensors) into step<k>.safetensors by rank 0.
MIXTRAIN_WORKER(tied_embeddings_recorded_steps) {
  const ParallelConfig& p = worker.parallel;
  const ResolvedConfig config =
      load_config(source_path("configs/qwen2_tiny.yaml"),
                  {"model.tie_word_embeddings=true", "train.lr_scheduler.warmup_steps=0",
                   "train.lr_scheduler.decay=constant", "train.max_grad_norm=0", "data.seq_len=32",
                   "data.micro_batch_size=4", "train.steps=" + std::to_string(kRecordedSteps),
                   "parallel.dp_replicate=" + std::to_string(p.dp_replicate),
                   "parallel.dp_shard=" + std::to_string(p.dp_shard),
                   "parallel.cp=" + std::to_string(p.cp), "parallel.tp=" + std::to_string(p.tp)});
  DeviceMesh mesh = worker.make_mesh();
  Trainer trainer(config, mesh, (worker.dir / "run").string());
  for (int step = 1; step <= kRecordedSteps; ++step) {
    const NamedTensors recorded = test_support::recorded_step(trainer);
    if (worker.rank.rank == 0) {
      write_safetensors((worker.dir / ("step" + std::to_string(step) + ".safetensors")).string(),
                        recorded);
    }
  }
}

// Every step of each layout against one process: the loss, the gradient norm, every parameter's
// gradient (the tied model.embed_tokens.weight carries both the lookup's and the head's) and the
// params after the update. float32 throughout (qwen2_tiny.yaml, AdamW, no fp32 main params); the
// layouts differ from one process in float32 summation order only (the ranks' halves of the
// batch summed by the reduction instead of by the accumulation, the tp vocabulary split, the cp
// ring's merged attention). Measured (LibTorch 2.11, AMX CPU, 2026-12-08), relative to each
// tensor's largest element: loss and grad norm <= 2e-7; gradients <= 6e-7 at step 1 (the same
// parameters) and <= 1.8e-5 at steps 2-3; params <= 2.3e-3 (AdamW divides each element by its
// own magnitude, so an element whose gradient is within rounding of zero may step by up to
// the learning rate either way). Bounds: loss and grad norm 1e-5, gradients 1e-4, params 1e-2.
// A gradient counted twice, or summed over the ranks without the division by their number, is
// off by 100% of it and doubles the grad norm (checked: the test fails when
// distributed/dim0_shard_grad.cpp leaves out its division by the ranks, with the loss of every
// step unchanged, and when tensor_parallel.cpp's reduce_from_tp doubles its backward). No clip
// here, so the recorded gradients are the reduced ones themselves, not scaled to norm 1.
TEST(TiedEmbeddingsTrain, EveryStepsGradientMatchesOneProcess) {
  const WorkerResult one = run_workers("tied_embeddings_recorded_steps", 1, ParallelConfig{});
  ASSERT_TRUE(one.all_ok()) << one.summary();
  std::vector<std::map<std::string, at::Tensor>> reference;
  for (int step = 1; step <= kRecordedSteps; ++step) {
    reference.push_back(test_support::as_map(
        read_safetensors((one.dir() / ("step" + std::to_string(step) + ".safetensors")).string())
            .tensors));
  }
  const std::string embedding = "grad.model.embed_tokens.weight";
  ASSERT_EQ(reference[0].count(embedding), 1u);
  EXPECT_EQ(reference[0].count("grad.lm_head.weight"), 0u) << "the model is not tied";
  struct Layout {
    const char* label;
    int64_t dp_replicate, dp_shard, cp, tp;
  };
  for (const Layout& layout : {Layout{"FSDP 2", 1, 2, 1, 1}, Layout{"DDP 2", 2, 1, 1, 1},
                               Layout{"TP 2", 1, 1, 1, 2}, Layout{"CP 2", 1, 1, 2, 1}}) {
    SCOPED_TRACE(layout.label);
    ParallelConfig parallel;
    parallel.dp_replicate = layout.dp_replicate;
    parallel.dp_shard = layout.dp_shard;
    parallel.cp = layout.cp;
    parallel.tp = layout.tp;
    const WorkerResult many = run_workers("tied_embeddings_recorded_steps", 2, parallel);
    ASSERT_TRUE(many.all_ok()) << many.summary();
    for (int step = 1; step <= kRecordedSteps; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const auto& want = reference[step - 1];
      const auto got = test_support::as_map(
          read_safetensors((many.dir() / ("step" + std::to_string(step) + ".safetensors")).string())
              .tensors);
      ASSERT_EQ(got.size(), want.size());
      double worst_grad = 0, worst_param = 0;
      for (const auto& [key, expected] : want) {
        ASSERT_EQ(got.count(key), 1u) << key;
        const double difference = test_support::relative_difference(got.at(key), expected);
        const bool grad = key.rfind("grad.", 0) == 0;
        const bool param = key.rfind("main.", 0) == 0 || key.rfind("model.", 0) == 0;
        EXPECT_LE(difference, grad ? 1e-4 : param ? 1e-2 : 1e-5) << key;
        if (grad) worst_grad = std::max(worst_grad, difference);
        if (param) worst_param = std::max(worst_param, difference);
      }
      EXPECT_GT(want.at("grad_norm").item<double>(), 0.0);
      std::printf(
          "%s, step %d: loss %.9g (one process %.9g), grad norm %.9g (%.9g), embedding "
          "gradient %.2g, worst gradient %.2g, worst param %.2g (relative)\n",
          layout.label, step, got.at("loss").item<double>(), want.at("loss").item<double>(),
          got.at("grad_norm").item<double>(), want.at("grad_norm").item<double>(),
          test_support::relative_difference(got.at(embedding), want.at(embedding)), worst_grad,
          worst_param);
    }
  }
}

TEST(TiedEmbeddingsTrain, ExpertParallelMatchesOneProcess) {
  expect_layout_matches_one_process(
      moe_command, "--nproc 2 --set parallel.dp_shard=2 --set parallel.ep=2", "EP 2");
}

TEST(TiedEmbeddingsTrain, CheckpointHoldsTheMatrixOnceAndResumesExactly) {
  TrainThenResume runs;
  const auto two_ranks = [](const std::string& run_dir) {
    return dense_command(run_dir) + " --nproc 2 --set parallel.dp_shard=2";
  };
  ASSERT_NO_FATAL_FAILURE(train_then_resume(two_ranks, " --set checkpoint.interval=2", runs));
  std::ifstream in(runs.split.file("checkpoints/step-00000002/.metadata.json"));
  const std::string metadata((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(metadata.find("\"model.model.embed_tokens.weight\""), std::string::npos);
  EXPECT_EQ(metadata.find("lm_head"), std::string::npos) << "a tied model saves no head";
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
