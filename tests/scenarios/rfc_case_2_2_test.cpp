// fp32-main-params fp32-main-params §2.2 (bfloat16 model, fp32_main_params, Muon + AdamW, 2 FSDP
// ranks): train 1 step, save, a new Trainer restores, and its next kLaterSteps steps are the
// continuous run's bit for bit (the same computation on the same state, the same windows of the
// data: a data position restored off by anything, the data-parallel degree included, reads
// other windows and fails the loss); the checkpoint holds an fp32 main param for every bfloat16
// param, bit-equal to the live one, including values bfloat16 cannot represent; Muon momentum,
// AdamW moments, step counters and group hyper-parameters come back.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>

#include "mixtrain/optim/training_optimizer.h"
#include "support/multiprocess.h"
#include "support/scoped_temp_dir.h"
#include "support/trainer_probe.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using test_support::checkpoint_test_config;
using test_support::recorded_step;
using test_support::whole_optimizer_state;
using testing::run_workers;
using testing::WorkerResult;

// Steps compared after the restore (steps 2..1 + kLaterSteps): more than one, so that what the
// restore sets up for later steps (the data position advancing from where it was put, the
// optimizer's step counters) is compared too, not only the first step.
constexpr int kLaterSteps = 3;

std::string step_file(const std::string& run, int step) {
  return run + "_step" + std::to_string(step) + ".safetensors";
}

ResolvedConfig config_for(const testing::WorkerEnv& worker, const std::string& restore_from) {
  std::vector<std::string> overrides = {"parallel.dp_shard=2",
                                        "checkpoint.dir=" + worker.get("CKPT")};
  if (!restore_from.empty()) overrides.push_back("checkpoint.restore_from=" + restore_from);
  return checkpoint_test_config(overrides);
}

void write_on_rank0(const testing::WorkerEnv& worker, const std::string& name,
                    const NamedTensors& tensors) {
  if (worker.rank.rank == 0) write_safetensors((worker.dir / name).string(), tensors);
}

MIXTRAIN_WORKER(case_2_2_continuous) {
  DeviceMesh mesh = worker.make_mesh();
  Trainer trainer(config_for(worker, ""), mesh, worker.dir.string());
  trainer.step();
  trainer.save_checkpoint();
  write_on_rank0(worker, "state_at_save.safetensors", whole_optimizer_state(trainer));
  if (worker.rank.rank == 0)
    worker.write_text("groups_at_save.json",
                      trainer.optimizer().chained().param_groups_state().dump());
  for (int step = 2; step <= 1 + kLaterSteps; ++step) {
    write_on_rank0(worker, step_file("continuous", step), recorded_step(trainer));
  }
}

MIXTRAIN_WORKER(case_2_2_restored) {
  DeviceMesh mesh = worker.make_mesh();
  Trainer trainer(config_for(worker, worker.get("CKPT")), mesh, worker.dir.string());
  EXPECT_EQ(trainer.completed_steps(), 1);
  write_on_rank0(worker, "state_after_restore.safetensors", whole_optimizer_state(trainer));
  if (worker.rank.rank == 0)
    worker.write_text("groups_after_restore.json",
                      trainer.optimizer().chained().param_groups_state().dump());
  for (int step = 2; step <= 1 + kLaterSteps; ++step) {
    write_on_rank0(worker, step_file("restored", step), recorded_step(trainer));
  }
}

// A safetensors reader independent of ours: 8-byte little-endian header length, JSON header,
// raw bytes. Returns dtype and bytes of one tensor.
struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
RawTensor read_raw(const std::string& path, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  uint64_t header_size = 0;
  in.read(reinterpret_cast<char*>(&header_size), 8);
  std::string header(header_size, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_size));
  const nlohmann::json entry = nlohmann::json::parse(header).at(name);
  const auto begin = entry.at("data_offsets")[0].get<int64_t>();
  const auto end = entry.at("data_offsets")[1].get<int64_t>();
  RawTensor raw{entry.at("dtype"), entry.at("shape").get<std::vector<int64_t>>(),
                std::string(static_cast<size_t>(end - begin), '\0')};
  in.seekg(static_cast<std::streamoff>(8 + header_size + begin));
  in.read(raw.bytes.data(), end - begin);
  return raw;
}

TEST(RfcCase22, RestoredTrainerContinuesBitForBit) {
  const test_support::ScopedTempDir dir("mixtrain_case_2_2_");  // removed however the test ends
  const std::filesystem::path ckpt = dir.path() / "checkpoints";
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  const std::map<std::string, std::string> env = {{"CKPT", ckpt.string()}};
  WorkerResult continuous = run_workers("case_2_2_continuous", 2, parallel, env);
  ASSERT_TRUE(continuous.all_ok()) << continuous.summary();
  WorkerResult restored = run_workers("case_2_2_restored", 2, parallel, env);
  ASSERT_TRUE(restored.all_ok()) << restored.summary();

  // The checkpoint: fp32_from_fp16_params for every (bfloat16) param, float32, bit-equal to the
  // main params at save, read by the reader above from the two rank files via the metadata.
  const auto step_dir = ckpt / "step-00000001";
  const nlohmann::json metadata = nlohmann::json::parse(std::ifstream(step_dir / ".metadata.json"));
  const auto at_save = test_support::as_map(
      read_safetensors((continuous.dir() / "state_at_save.safetensors").string()).tensors);
  int64_t mains = 0, not_bf16_representable = 0;
  for (const auto& [key, main] : at_save) {
    if (key.rfind(kMainParamPrefix, 0) != 0) continue;
    ++mains;
    ASSERT_TRUE(metadata["tensors"].contains(key)) << key;
    at::Tensor assembled = at::empty_like(main);
    for (const auto& chunk : metadata["tensors"][key]["chunks"]) {
      const RawTensor raw =
          read_raw((step_dir / chunk["file"].template get<std::string>()).string(), key);
      EXPECT_EQ(raw.dtype, "F32") << key;
      const int64_t offset = chunk["offsets"][0].template get<int64_t>();
      at::Tensor rows = assembled.narrow(0, offset, raw.shape[0]);
      ASSERT_EQ(static_cast<int64_t>(raw.bytes.size()), rows.numel() * 4) << key;
      std::memcpy(rows.data_ptr<float>(), raw.bytes.data(), raw.bytes.size());
    }
    EXPECT_TRUE(assembled.equal(main)) << key << ": not the main param's bits";
    not_bf16_representable += main.ne(main.to(at::kBFloat16).to(at::kFloat)).sum().item<int64_t>();
  }
  // Every trainable param of the tiny model is bfloat16: one main param each.
  int64_t model_keys = 0;
  for (const auto& [key, value] : metadata["tensors"].items())
    model_keys += key.rfind("model.", 0) == 0;
  EXPECT_EQ(mains, model_keys);
  EXPECT_GT(not_bf16_representable, 0) << "the test must hold mantissa bits bfloat16 loses";

  // Optimizer state (Muon momentum, AdamW moments, step counters, main params) and group
  // hyper-parameters restored exactly.
  test_support::expect_bitwise_equal(
      read_safetensors((restored.dir() / "state_after_restore.safetensors").string()).tensors,
      read_safetensors((continuous.dir() / "state_at_save.safetensors").string()).tensors);
  EXPECT_EQ(restored.read_text("groups_after_restore.json"),
            continuous.read_text("groups_at_save.json"));
  // The next steps: loss, grad norm, grads, main params, model params, bit for bit.
  for (int step = 2; step <= 1 + kLaterSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    test_support::expect_bitwise_equal(
        read_safetensors((restored.dir() / step_file("restored", step)).string()).tensors,
        read_safetensors((continuous.dir() / step_file("continuous", step)).string()).tensors);
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
