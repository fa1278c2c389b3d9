// fp32-main-params fp32-main-params §2.3: a float32 model with fp32_main_params and Muon + AdamW.
// Every param is its own main param (no copy), the checkpoint's fp32_from_fp16_params mapping is
// empty and no tensor is saved twice, and a restored Trainer continues exactly like the
// continuous one (bitwise: the same computation on the same state).
#include <gtest/gtest.h>

#include <filesystem>

#include "mixtrain/checkpoint/storage.h"
#include "mixtrain/optim/mixed_precision_optimizer.h"
#include "support/scoped_temp_dir.h"
#include "support/trainer_probe.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(RfcCase23, Float32ModelKeepsNoRedundantMainParamsAndResumes) {
  const test_support::ScopedTempDir scoped("mixtrain_case_2_3_");  // removed however it ends
  const std::filesystem::path dir = scoped.path() / "run";
  const std::vector<std::string> float32 = {
      "model_init_dtype=float32", "fsdp_config.mix_precision.param_dtype=float32",
      "fsdp_config.mix_precision.output_dtype=float32", "checkpoint.dir=" + dir.string()};
  const DeviceMesh mesh = make_single_process_mesh();
  Trainer continuous(test_support::checkpoint_test_config(float32), mesh, dir.string());

  auto* wrapper = dynamic_cast<MixedPrecisionOptimizer*>(&continuous.optimizer());
  ASSERT_NE(wrapper, nullptr) << "fp32_main_params: true builds the mixed-precision wrapper";
  EXPECT_TRUE(wrapper->low_precision_names().empty());
  ChainedOptimizer& chained = continuous.optimizer().chained();
  for (const auto& name : chained.names()) {
    EXPECT_EQ(chained.model_param(name).scalar_type(), at::kFloat) << name;
    EXPECT_TRUE(wrapper->is_own_main_param(name)) << name;
    // The same tensor object and storage: no copy exists.
    EXPECT_TRUE(chained.optimizer_param(name).is_same(chained.model_param(name))) << name;
  }

  continuous.step();
  continuous.save_checkpoint();
  NamedTensors state_at_save;
  for (const auto& [key, t] : continuous.optimizer().state_dict()) {
    EXPECT_NE(key.rfind(kMainParamPrefix, 0), 0u) << key;
    state_at_save.emplace_back(key, t.clone());
  }
  CheckpointReader reader(resolve_step_dir(dir.string()));
  int64_t model_keys = 0, state_keys = 0;
  for (const auto& [key, tensor] : reader.metadata().tensors) {
    EXPECT_NE(key.rfind(kMainParamPrefix, 0), 0u) << "fp32 model saved a main param: " << key;
    model_keys += key.rfind("model.", 0) == 0;
    state_keys += key.rfind(kOptimizerStatePrefix, 0) == 0;
  }
  EXPECT_EQ(model_keys, static_cast<int64_t>(chained.names().size()));
  EXPECT_EQ(state_keys, static_cast<int64_t>(state_at_save.size()));
  const NamedTensors expected = test_support::recorded_step(continuous);

  std::vector<std::string> restore = float32;
  restore.push_back("checkpoint.restore_from=" + dir.string());
  Trainer restored(test_support::checkpoint_test_config(restore), mesh, dir.string());
  EXPECT_EQ(restored.completed_steps(), 1);
  test_support::expect_bitwise_equal(restored.optimizer().state_dict(), state_at_save);
  test_support::expect_bitwise_equal(test_support::recorded_step(restored), expected);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
