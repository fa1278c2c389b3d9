// fp32-main-params RFC case 2.4 (bfloat16 model, fp32_main_params, Muon + AdamW):
// 1. a checkpoint without the _mixed_precision_optimizer subtree (a plain optimizer
//    checkpoint) restores the Muon + AdamW state, rebuilds the main params from the loaded
//    bfloat16 model and warns that the fp32 mantissa bits cannot be recovered;
// 2. a checkpoint with only some main params is damaged data: the restore fails listing the
//    missing parameter names, and the trainer's model and optimizer state are untouched.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/trainer/checkpointing.h"
#include "support/checkpoint_surgery.h"
#include "support/trainer_probe.h"

namespace mixtrain {
namespace {

bool is_main_key(const std::string& key) {
  return key.rfind(kMainParamPrefix, 0) == 0;
}

class RfcCase24 : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("mixtrain_case_2_4_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    trainer_ = std::make_unique<Trainer>(config(""), mesh_, dir_.string());
    trainer_->step();
    trainer_->save_checkpoint();
    saved_ = resolve_step_dir(trainer_->checkpoint_dir());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  ResolvedConfig config(const std::string& restore_from) const {
    std::vector<std::string> overrides = {"checkpoint.dir=" + (dir_ / "checkpoints").string()};
    if (!restore_from.empty()) overrides.push_back("checkpoint.restore_from=" + restore_from);
    return test_support::checkpoint_test_config(overrides);
  }
  // Model params and optimizer state (main params included), copied.
  NamedTensors snapshot(Trainer& trainer) const {
    NamedTensors out;
    for (const auto& item : trainer.model().named_parameters())
      out.emplace_back("model." + item.key(), item.value().detach().clone());
    for (const auto& [key, t] : trainer.optimizer().state_dict()) out.emplace_back(key, t.clone());
    return out;
  }

  std::filesystem::path dir_;
  DeviceMesh mesh_ = make_single_process_mesh();
  std::unique_ptr<Trainer> trainer_;
  std::string saved_;
};

TEST_F(RfcCase24, PlainOptimizerCheckpointLoadsRebuildsMainParamsAndWarns) {
  const std::string plain = test_support::copy_checkpoint(
      saved_, (dir_ / "plain").string(), [](const std::string& key) { return !is_main_key(key); });
  const auto saved = test_support::as_map(snapshot(*trainer_));

  ::testing::internal::CaptureStderr();
  const int warnings_before = warning_count();
  Trainer restored(config(plain), mesh_, dir_.string());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(warning_count(), warnings_before + 1) << log;
  EXPECT_NE(log.find("mantissa"), std::string::npos) << log;
  EXPECT_NE(log.find("cannot be restored"), std::string::npos) << log;

  ChainedOptimizer& chained = restored.optimizer().chained();
  int64_t lost_bits = 0;
  for (const auto& [key, t] : restored.optimizer().state_dict()) {
    if (!is_main_key(key)) {
      // Muon momentum, AdamW moments, step counters: as saved.
      EXPECT_TRUE(t.equal(saved.at(key))) << key;
      continue;
    }
    // Main params rebuilt from the loaded bfloat16 model: exactly its float32 value...
    const std::string name = key.substr(std::string(kMainParamPrefix).size());
    EXPECT_TRUE(t.equal(chained.model_param(name).to(at::kFloat))) << key;
    // ...which lost the mantissa bits the saved main param had.
    lost_bits += t.ne(saved.at(key)).sum().item<int64_t>();
  }
  EXPECT_GT(lost_bits, 0);
  for (const auto& item : restored.model().named_parameters()) {
    EXPECT_TRUE(item.value().equal(saved.at("model." + item.key()))) << item.key();
  }
}

TEST_F(RfcCase24, PartialMainParamsFailListingThemAndChangeNothing) {
  // Drop two main params; the trainer that restores has moved on by one step, so a partial
  // load would be visible.
  const std::string missing_a = "model.layers.0.self_attn.q_proj.weight";
  const std::string missing_b = "model.norm.weight";
  const std::string partial = test_support::copy_checkpoint(
      saved_, (dir_ / "partial").string(), [&](const std::string& key) {
        return key != kMainParamPrefix + missing_a && key != kMainParamPrefix + missing_b;
      });
  trainer_->step();
  const NamedTensors before = snapshot(*trainer_);

  CheckpointParts parts{trainer_->model(), trainer_->sharded(),  trainer_->optimizer(),
                        trainer_->data(),  trainer_->resolved(), trainer_->mesh()};
  try {
    restore_checkpoint(parts, partial, /*restore_optimizer=*/true);
    FAIL() << "a partial set of main params must not load";
  } catch (const DataError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("missing: "), std::string::npos) << message;
    EXPECT_NE(message.find(missing_a), std::string::npos) << message;
    EXPECT_NE(message.find(missing_b), std::string::npos) << message;
    EXPECT_NE(message.find(partial), std::string::npos) << message;
  }
  test_support::expect_bitwise_equal(snapshot(*trainer_), before);
  // And through the constructor: the same error, exit code of a data error.
  EXPECT_THROW(Trainer(config(partial), mesh_, dir_.string()), DataError);
}

}  // namespace
}  // namespace mixtrain
