// Tied embeddings (model.tie_word_embeddings) through `mixtrain train`: every parallel layout
// against one process on the same global batch -- FSDP, tensor and context parallelism on the
// dense qwen2, expert parallelism on qwen3_moe -- the checkpoint holds the shared matrix once
// (model.model.embed_tokens.weight, no model.lm_head.weight), and a run restored from a
// checkpoint continues exactly like one run on two FSDP ranks. The model-level parity with
// transformers is tests/unit/model/qwen2_test.cpp / qwen2_moe_test.cpp; HF in and out,
// tests/tools/export_hf_command_test.cpp.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "support/train_then_resume.h"
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

// Runs `layout` and one process for 2 steps and compares their losses. float32 throughout; the
// layouts differ from one process only in float32 summation order (ranks' halves of the batch,
// the tp vocabulary split of the cross-entropy, the cp ring's merged attention, the experts'
// token exchange: 2^-24 per addition over a few thousand terms), so 1e-5 relative, as
// tests/tools/qwen2_train_test.cpp; a head that did not share the embedding, or a gradient
// counted once or twice too often, moves the second step's loss by far more (the first
// update changes every logit).
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
  }
  std::printf("%s: step 2 loss %.6f (one process %.6f)\n", label.c_str(),
              a[1]["loss"].get<double>(), b[1]["loss"].get<double>());
}

TEST(TiedEmbeddingsTrain, FsdpTensorAndContextParallelMatchOneProcess) {
  expect_layout_matches_one_process(dense_command, "--nproc 2 --set parallel.dp_shard=2", "FSDP 2");
  expect_layout_matches_one_process(
      dense_command, "--nproc 2 --set parallel.dp_shard=1 --set parallel.tp=2", "TP 2");
  expect_layout_matches_one_process(
      dense_command, "--nproc 2 --set parallel.dp_shard=1 --set parallel.cp=2", "CP 2");
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
