// trainer/checkpointing: what a restore refuses, and that a refused restore changes nothing.
// One process, bfloat16 model with fp32 main params, Muon + AdamW (configs/qwen2_moe_tiny.yaml
// shrunk, tests/support/trainer_probe.h). The RFC's cases 2.2-2.4 are tests/scenarios/.
#include "mixtrain/trainer/checkpointing.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "mixtrain/core/error.h"
#include "mixtrain/data/dataset.h"
#include "support/checkpoint_surgery.h"
#include "support/trainer_probe.h"

namespace mixtrain {
namespace {

class CheckpointingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("mixtrain_checkpointing_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    trainer_ = make_trainer({});
    trainer_->step();
    trainer_->save_checkpoint();
    saved_ = resolve_step_dir(trainer_->checkpoint_dir());
    trainer_->step();  // moved on: any partial restore would show
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Trainer> make_trainer(std::vector<std::string> overrides) {
    overrides.push_back("checkpoint.dir=" + (dir_ / "checkpoints").string());
    resolved_.push_back(
        std::make_unique<ResolvedConfig>(test_support::checkpoint_test_config(overrides)));
    return std::make_unique<Trainer>(*resolved_.back(), mesh_, dir_.string());
  }
  NamedTensors snapshot(Trainer& trainer) {
    NamedTensors out;
    for (const auto& item : trainer.model().named_parameters())
      out.emplace_back("model." + item.key(), item.value().detach().clone());
    for (const auto& [key, t] : trainer.optimizer().state_dict()) out.emplace_back(key, t.clone());
    return out;
  }
  // Restores `path` into the trainer; expects a DataError containing every `needles` and no
  // change at all.
  void expect_refused(const std::string& path, const std::vector<std::string>& needles,
                      bool restore_optimizer = true) {
    const NamedTensors before = snapshot(*trainer_);
    CheckpointParts parts{trainer_->model(), trainer_->sharded(),  trainer_->optimizer(),
                          trainer_->data(),  trainer_->resolved(), trainer_->mesh()};
    try {
      restore_checkpoint(parts, path, restore_optimizer);
      ADD_FAILURE() << "restoring " << path << " should fail";
    } catch (const DataError& error) {
      for (const auto& needle : needles)
        EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
            << "'" << needle << "' not in: " << error.what();
    }
    test_support::expect_bitwise_equal(snapshot(*trainer_), before);
  }
  std::string copy(const std::string& name,
                   const std::function<at::Tensor(const std::string&, at::Tensor)>& edit) {
    return test_support::copy_checkpoint(
        saved_, (dir_ / name).string(), [](const std::string&) { return true; }, edit);
  }

  std::filesystem::path dir_;
  DeviceMesh mesh_ = make_single_process_mesh();
  std::vector<std::unique_ptr<ResolvedConfig>> resolved_;
  std::unique_ptr<Trainer> trainer_;
  std::string saved_;
};

const std::string kExpAvg = std::string(kOptimizerStatePrefix) + "lm_head.weight.exp_avg";

TEST_F(CheckpointingTest, RestoresBackToTheSavedStep) {
  const NamedTensors before = snapshot(*trainer_);
  CheckpointParts parts{trainer_->model(), trainer_->sharded(),  trainer_->optimizer(),
                        trainer_->data(),  trainer_->resolved(), trainer_->mesh()};
  EXPECT_EQ(restore_checkpoint(parts, (dir_ / "checkpoints").string(), true), 1);
  // The state of step 1 (a fresh trainer restored from it agrees bit for bit).
  auto fresh = make_trainer({"checkpoint.restore_from=" + saved_});
  test_support::expect_bitwise_equal(snapshot(*trainer_), snapshot(*fresh));
  EXPECT_EQ(trainer_->data().position(), fresh->data().position());
}

TEST_F(CheckpointingTest, RefusesAnotherModel) {
  auto other = make_trainer({"model.hidden_size=32", "model.num_heads=4", "model.head_dim=8"});
  other->step();
  other->save_checkpoint();
  expect_refused(resolve_step_dir(other->checkpoint_dir()),
                 {"another model", "model.hidden_size: 32 in the checkpoint, 24 now"});
}

TEST_F(CheckpointingTest, RefusesWrongShapeAndDtype) {
  const std::string shape = copy("shape", [](const std::string& key, at::Tensor t) {
    return key == "model.lm_head.weight" ? t.narrow(0, 0, t.size(0) - 1).contiguous() : t;
  });
  expect_refused(shape, {"model.lm_head.weight: shape [36, 24] in the checkpoint, [37, 24]"});
  const std::string dtype = copy("dtype", [](const std::string& key, at::Tensor t) {
    return key == kExpAvg ? t.to(at::kInt) : t;  // floating state of another dtype is cast
  });
  expect_refused(dtype, {kExpAvg + ": dtype int32 in the checkpoint, float32 expected"});
}

TEST_F(CheckpointingTest, RefusesCorruptFiles) {
  // One flipped byte in the rank file's data: the checksum names the key's chunk.
  const std::string flipped = copy("flipped", nullptr);
  const std::string file = flipped + "/__0_0.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    f.seekp(-5, std::ios::end);
    f.write(&byte, 1);
  }
  expect_refused(flipped, {"__0_0.safetensors", "checksum"});

  const std::string truncated = copy("truncated", nullptr);
  std::filesystem::resize_file(truncated + "/__0_0.safetensors",
                               std::filesystem::file_size(truncated + "/__0_0.safetensors") - 7);
  expect_refused(truncated, {"__0_0.safetensors"});

  const std::string malformed = copy("malformed", nullptr);
  std::ofstream(malformed + "/.metadata.json") << "{\"format\": ";
  expect_refused(malformed, {".metadata.json"});

  expect_refused((dir_ / "nowhere").string(), {"nowhere"});
}

TEST_F(CheckpointingTest, ModelOnlyCheckpoints) {
  auto model_only = make_trainer({"checkpoint.save_optimizer=false"});
  model_only->step();
  model_only->save_checkpoint();
  const std::string path = resolve_step_dir(model_only->checkpoint_dir());
  expect_refused(path, {"no optimizer state", "checkpoint.restore_optimizer: false"});

  // restore_optimizer false (RFC 9.4): the model, then main params rebuilt from it; the
  // optimizer state of the trainer stays (no moments or momentum are loaded).
  CheckpointParts parts{trainer_->model(), trainer_->sharded(),  trainer_->optimizer(),
                        trainer_->data(),  trainer_->resolved(), trainer_->mesh()};
  restore_checkpoint(parts, path, /*restore_optimizer=*/false);
  ChainedOptimizer& chained = trainer_->optimizer().chained();
  for (const auto& item : model_only->model().named_parameters()) {
    EXPECT_TRUE(trainer_->model().named_parameters()[item.key()].equal(item.value())) << item.key();
    EXPECT_TRUE(chained.optimizer_param(item.key()).equal(item.value().to(at::kFloat)))
        << item.key();
  }
}

// A float32 model restored from this bfloat16 run (fp32 main params) takes every parameter's
// value from its main param, bit for bit, not from the bf16-rounded model param; with the
// optimizer, its state too (the main-param keys are consumed, not "unexpected").
TEST_F(CheckpointingTest, AFloat32ModelTakesTheMainParamsOfAMixedPrecisionRun) {
  auto bits_equal = [](const at::Tensor& a, const at::Tensor& b) {
    if (a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes())) return false;
    if (a.scalar_type() != at::kFloat) return a.equal(b);
    return a.contiguous().view(at::kInt).equal(b.contiguous().view(at::kInt));
  };
  CheckpointReader reader(saved_);
  const std::vector<std::string> float32 = {"model_init_dtype=float32",
                                            "fsdp_config.mix_precision.param_dtype=float32",
                                            "checkpoint.restore_from=" + saved_};
  int rounded_differently = 0;
  for (const bool with_optimizer : {true, false}) {
    std::vector<std::string> overrides = float32;
    overrides.push_back(std::string("checkpoint.restore_optimizer=") +
                        (with_optimizer ? "true" : "false"));
    auto restored = make_trainer(overrides);
    for (const auto& item : restored->model().named_parameters()) {
      ASSERT_EQ(item.value().scalar_type(), at::kFloat) << item.key();
      const at::Tensor main = reader.read_full(std::string(kMainParamPrefix) + item.key());
      EXPECT_TRUE(bits_equal(item.value(), main)) << item.key();
      const at::Tensor bf16 = reader.read_full("model." + item.key()).to(at::kFloat);
      rounded_differently += item.value().equal(bf16) ? 0 : 1;
    }
    if (with_optimizer) {
      for (const auto& [key, t] : restored->optimizer().state_dict()) {
        EXPECT_TRUE(bits_equal(t, reader.read_full(key))) << key;
      }
    }
  }
  EXPECT_GT(rounded_differently, 0);  // the main params carry bits the bf16 params lost
}

}  // namespace
}  // namespace mixtrain
