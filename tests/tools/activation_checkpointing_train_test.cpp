// train.activation_checkpointing through `mixtrain train` on configs/qwen2_moe_tiny.yaml (bfloat16
// model, fp32 main params, Muon + AdamW, the router's aux loss): full and selective on one process,
// and full on two ranks with FSDP, expert, tensor and context parallelism, each against the same
// layout without it. The recomputed forward is the same arithmetic (no RNG), so the logged loss,
// aux loss and gradient norm of every step and every byte of the checkpoint's tensor files (model,
// main params, optimizer state after 3 steps) are identical. The memory it saves: bench/.
//
// Equal results alone would also pass if the setting did nothing, so both runs count their ATen
// ops per phase (train.count_ops; counting changes nothing that is computed) and the recomputed
// run must show the recomputation: its backward dispatches the recomputed layers' forward ops
// again. Measured (LibTorch 2.11, 2026-12-08): on one process the forward dispatches 2346 ops at
// step 1 and full's backward 2076 more than the plain one (the two decoder layers are 88% of
// the forward), selective every 2 exactly half of that (1038: layer 1 only); on the 2-rank
// layouts full adds 81-92% of the plain forward. Bounds: full's backward grows by >= 1/2 of the
// plain forward's ops on every layout, selective's by more than 0 and by less than full's (layer
// 0 is not recomputed). A trainer that dropped the setting adds no op (checked: the test fails
// when trainer.cpp passes 0 for "full").
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
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

// The backward's extra ops of the recomputed run over the plain one, per step.
using ExtraOps = std::vector<int64_t>;

ExtraOps expect_same_training(const std::string& layout, const std::string& with_ac,
                              const std::string& label) {
  TempDir run;
  const std::string base = "train --config " + source_path("configs/qwen2_moe_tiny.yaml") +
                           " --set train.steps=3 --set checkpoint.interval=3" +
                           " --set train.log_every=1 --set train.count_ops=true " + layout +
                           " --run-dir ";
  const CommandResult plain = run_mixtrain(base + run.file("plain"));
  EXPECT_EQ(plain.exit_code, 0) << plain.output;
  const CommandResult ac = run_mixtrain(base + run.file("ac") + " " + with_ac);
  EXPECT_EQ(ac.exit_code, 0) << label << "\n" << ac.output;
  const auto a = read_metrics(run.file("plain/metrics.jsonl"));
  const auto b = read_metrics(run.file("ac/metrics.jsonl"));
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(b.size(), 3u);
  if (a.size() != 3u || b.size() != 3u) return {};
  ExtraOps extra;
  for (size_t i = 0; i < a.size(); ++i) {
    for (const char* key : {"loss", "aux_loss", "grad_norm"}) {
      EXPECT_EQ(a[i][key].get<double>(), b[i][key].get<double>())
          << label << ", step " << i + 1 << ", " << key;
    }
    const int64_t forward = a[i]["ops_forward"].get<int64_t>();
    extra.push_back(b[i]["ops_backward"].get<int64_t>() - a[i]["ops_backward"].get<int64_t>());
    std::printf(
        "%s, step %zu: forward %lld ops (recomputed run %lld), backward %lld ops, "
        "recomputed run %+lld\n",
        label.c_str(), i + 1, static_cast<long long>(forward),
        static_cast<long long>(b[i]["ops_forward"].get<int64_t>()),
        static_cast<long long>(a[i]["ops_backward"].get<int64_t>()),
        static_cast<long long>(extra.back()));
    if (with_ac.find("=full") != std::string::npos) {
      EXPECT_GE(2 * extra.back(), forward)
          << label << ", step " << i + 1
          << ": the backward did not run the layers' forward again (no recomputation)";
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
  return extra;
}

TEST(ActivationCheckpointingTrain, OneProcessFullAndSelectiveAreBitwiseTheSame) {
  const ExtraOps full =
      expect_same_training("", "--set train.activation_checkpointing=full", "full");
  const ExtraOps selective = expect_same_training("",
                                                  "--set train.activation_checkpointing=selective "
                                                  "--set train.activation_checkpointing_every=2",
                                                  "selective every 2");
  ASSERT_EQ(full.size(), 3u);
  ASSERT_EQ(selective.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_GT(selective[i], 0) << "step " << i + 1 << ": selective recomputed nothing";
    EXPECT_LT(selective[i], full[i]) << "step " << i + 1 << ": selective recomputed every layer";
  }
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
