// train.activation_checkpointing through `mixtrain train` on configs/qwen2_moe_tiny.yaml (bfloat16
// model, fp32 main params, Muon + AdamW, the router's aux loss): full and selective on one process,
// and full on two ranks with FSDP, expert, tensor and context parallelism, each against the same
// layout without it. The recomputed forward is the same arithmetic (no RNG), so the logged loss,
// aux loss and gradient norm of every step and every byte of the checkpoint's tensor files (model,
// main params, optimizer state after 3 steps) are identical. The memory it saves: bench/.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void expect_same_training(const std::string& layout, const std::string& with_ac,
                          const std::string& label) {
  TempDir run;
  const std::string base = "train --config " + source_path("configs/qwen2_moe_tiny.yaml") +
                           " --set train.steps=3 --set checkpoint.interval=3" +
                           " --set train.log_every=1 " + layout + " --run-dir ";
  const CommandResult plain = run_mixtrain(base + run.file("plain"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const CommandResult ac = run_mixtrain(base + run.file("ac") + " " + with_ac);
  ASSERT_EQ(ac.exit_code, 0) << label << "\n" << ac.output;
  const auto a = read_metrics(run.file("plain/metrics.jsonl"));
  const auto b = read_metrics(run.file("ac/metrics.jsonl"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    for (const char* key : {"loss", "aux_loss", "grad_norm"}) {
      EXPECT_EQ(a[i][key].get<double>(), b[i][key].get<double>())
          << label << ", step " << i + 1 << ", " << key;
    }
  }
  int files = 0;
  const std::string step = "/checkpoints/step-00000003";
  for (const auto& entry : fs::directory_iterator(run.file("plain") + step)) {
    if (entry.path().extension() != ".safetensors") continue;
    ++files;
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(read_bytes(entry.path().string()) == read_bytes(run.file("ac") + step + "/" + name))
        << label << ": " << name;
  }
  EXPECT_GT(files, 0) << label;
}

TEST(ActivationCheckpointingTrain, OneProcessFullAndSelectiveAreBitwiseTheSame) {
  expect_same_training("", "--set train.activation_checkpointing=full", "full");
  expect_same_training("",
                       "--set train.activation_checkpointing=selective "
                       "--set train.activation_checkpointing_every=2",
                       "selective every 2");
}

TEST(ActivationCheckpointingTrain, EveryParallelLayoutIsBitwiseTheSame) {
  const std::string full = "--set train.activation_checkpointing=full";
  expect_same_training("--nproc 2 --set parallel.dp_shard=2", full, "FSDP 2");
  expect_same_training("--nproc 2 --set parallel.dp_shard=2 --set parallel.ep=2", full, "EP 2");
  expect_same_training("--nproc 2 --set parallel.dp_shard=1 --set parallel.tp=2", full, "TP 2");
  expect_same_training("--nproc 2 --set parallel.dp_shard=1 --set parallel.cp=2", full, "CP 2");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
