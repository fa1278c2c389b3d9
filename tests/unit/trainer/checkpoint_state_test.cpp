// trainer/checkpoint_state: the non-tensor state read back field by field. The same checks
// through a whole restore (nothing changed on refusal) are in checkpointing_test.cpp.
#include "mixtrain/trainer/checkpoint_state.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <set>
#include <string>
#include <vector>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using json = nlohmann::json;
constexpr const char* kWhere = "/ckpt/step-00000003/.metadata.json";

// What make_save_request writes (abridged config), for step 3 of a float16 run on 2 ranks.
CheckpointMetadata metadata() {
  CheckpointMetadata m;
  m.step = 3;
  const json config = {{"model.hidden_size", "24"}, {"optimizer.lr", "0.001"}};
  const std::string text = config.dump();
  m.state = {
      {"train", {{"step", 3}}},
      {"lr_schedule",
       {{"warmup_steps", 0}, {"decay", "constant"}, {"min_lr_ratio", 0.1}, {"total_steps", 8}}},
      {"data", {{"position", 12}, {"description", "synthetic"}}},
      {"loss_scaler", {{"scale", 1024.0}, {"growth_tracker", 5}, {"skipped_steps", 1}}},
      {"optimizer",
       {{"saved", true},
        {"fp32_main_params", true},
        {"param_groups", json::array({{{"optimizer", "adamw"}}})}}},
      {"config", config},
      {"config_hash", format_xxh3_64(XXH3_64bits(text.data(), text.size()))},
      {"ranks",
       json::array({{{"rng_cpu", cpu_rng_state_hex()}}, {{"rng_cpu", cpu_rng_state_hex()}}})},
  };
  return m;
}

std::string error_of(const CheckpointMetadata& m) {
  try {
    read_training_state(m, kWhere);
  } catch (const DataError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(CheckpointState, ReadsEveryField) {
  const SavedTrainingState s = read_training_state(metadata(), kWhere);
  EXPECT_EQ(s.step, 3);
  EXPECT_EQ(s.data_position, 12);
  ASSERT_TRUE(s.loss_scaler.has_value());
  EXPECT_EQ(s.loss_scaler->scale, 1024.0);
  EXPECT_EQ(s.loss_scaler->growth_tracker, 5);
  EXPECT_EQ(s.loss_scaler->skipped_steps, 1);
  EXPECT_TRUE(s.optimizer_saved);
  EXPECT_TRUE(s.fp32_main_params);
  EXPECT_EQ(s.param_groups.size(), 1u);
  EXPECT_EQ(s.config.at("optimizer.lr"), "0.001");
  ASSERT_EQ(s.rng_cpu.size(), 2u);

  CheckpointMetadata m = metadata();
  m.state.erase("loss_scaler");  // a bfloat16 / float32 run has none
  m.state.erase("ranks");        // nothing recorded: the RNG is left as it is
  const SavedTrainingState t = read_training_state(m, kWhere);
  EXPECT_FALSE(t.loss_scaler.has_value());
  EXPECT_TRUE(t.rng_cpu.empty());
}

// The recorded generator state goes back bit for bit: the next draws repeat.
TEST(CheckpointState, RngStateRoundTrips) {
  at::manual_seed(7);
  at::randn({3});
  const std::string hex = cpu_rng_state_hex();
  const at::Tensor expected = at::randn({5});
  const at::Tensor bytes = cpu_rng_state_from_hex(hex, JsonFieldReader(kWhere), "f");
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(bytes);
  EXPECT_TRUE(at::randn({5}).equal(expected));
}

TEST(CheckpointState, NamesTheFileAndTheFieldOfEachBadValue) {
  const std::string rng = cpu_rng_state_hex();
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& s) { s["train"]["step"] = 4; },
       "state.train.step: 4 but the checkpoint's step is 3"},
      {[](json& s) { s["data"]["position"] = "12"; },
       "state.data.position: must be an integer, got \"12\""},
      {[](json& s) { s["loss_scaler"]["scale"] = -1.0; }, "state.loss_scaler.scale: must be > 0"},
      {[](json& s) { s["loss_scaler"]["skipped_steps"] = -1; },
       "state.loss_scaler.skipped_steps: must be >= 0, got -1"},
      {[](json& s) { s["lr_schedule"]["decay"] = 1; }, "state.lr_schedule.decay: must be a string"},
      {[](json& s) { s["optimizer"]["param_groups"] = "adamw"; },
       "state.optimizer.param_groups: must be a list, got string"},
      {[](json& s) { s["config"]["optimizer.lr"] = 0.001; },
       "state.config.optimizer.lr: must be a string, got 0.001"},
      {[](json& s) { s["config"]["optimizer.lr"] = "0.002"; }, "state.config_hash: "},
      {[&](json& s) { s["ranks"][1]["rng_cpu"] = rng + "00"; },
       "state.ranks[1].rng_cpu: must be " + std::to_string(rng.size()) + " hex digits"},
      {[&](json& s) { s["ranks"][1]["rng_cpu"] = rng.substr(0, 9) + "\xb1" + rng.substr(10); },
       "state.ranks[1].rng_cpu: character 9 is not a hex digit"},
      {[&](json& s) { s["ranks"][0]["rng_cpu"] = std::string(rng.size(), 'f'); },
       "state.ranks[0].rng_cpu: is not a valid CPU generator state"},
      {[](json& s) { s["ranks"][0] = "rng"; }, "state.ranks[0]: must be an object, got string"},
  };
  for (const auto& [edit, expected] : cases) {
    CheckpointMetadata m = metadata();
    edit(m.state);
    EXPECT_EQ(error_of(m).rfind(std::string(kWhere) + ": " + expected, 0), 0u) << expected << "\n"
                                                                               << error_of(m);
  }
}

// Each part is read on its own: problems in several parts are all reported, in field order,
// and the parts that had one are named so that a restore never uses their defaults.
TEST(CheckpointState, ReportsEveryBadPartNotOnlyTheFirst) {
  CheckpointMetadata m = metadata();
  m.state["train"]["step"] = "3";
  m.state["data"]["position"] = -1;
  m.state["loss_scaler"]["scale"] = 0.0;
  std::vector<std::string> problems;
  const SavedTrainingState s = read_training_state(m, kWhere, problems);
  const std::string w = std::string(kWhere) + ": ";
  EXPECT_EQ(problems,
            (std::vector<std::string>{w + "state.train.step: must be an integer, got \"3\"",
                                      w + "state.data.position: must be >= 0, got -1",
                                      w + "state.loss_scaler.scale: must be > 0, got 0.0"}));
  EXPECT_EQ(s.unread_parts, (std::set<std::string>{"train", "data", "loss_scaler"}));
  EXPECT_FALSE(s.loss_scaler.has_value());
  EXPECT_EQ(s.config.at("optimizer.lr"), "0.001");  // the good parts are read all the same
  EXPECT_EQ(s.rng_cpu.size(), 2u);
  // The throwing form: one DataError, every problem on its own line.
  EXPECT_EQ(error_of(m), problems[0] + "\n" + problems[1] + "\n" + problems[2]);

  std::vector<std::string> none;
  EXPECT_TRUE(read_training_state(metadata(), kWhere, none).unread_parts.empty());
  EXPECT_TRUE(none.empty());
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
