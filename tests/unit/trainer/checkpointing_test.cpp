// trainer/checkpointing: what a restore refuses, and that a refused restore changes nothing.
// One process, bfloat16 model with fp32 main params, Muon + AdamW (configs/qwen2_moe_tiny.yaml
// shrunk, tests/support/trainer_probe.h). fp32-main-params §2.2-2.4 are tests/scenarios/.
// Tensor-parallel boxes (ParamPlacement::global_offsets / local_sizes, what place() writes):
// tp_dim 0 and 1 combined with dp_shard rows, and tp_dim -1, saved by 4 processes (tp 2 x
// dp_shard 2) as pieces of global tensors, read back whole by one process; and a one-process
// save read back as each of the 4 ranks' boxes. Exact (copies only).
#include "mixtrain/trainer/checkpointing.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <xxhash.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "mixtrain/checkpoint/distributed_checkpoint.h"
#include "mixtrain/checkpoint/metadata.h"
#include "mixtrain/checkpoint/storage.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/param_placement.h"
#include "mixtrain/data/dataset.h"
#include "mixtrain/trainer/checkpoint_state.h"
#include "support/checkpoint_surgery.h"
#include "support/multiprocess.h"
#include "support/trainer_probe.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

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

  // restore_optimizer false (fp32-main-params §9.4): the model, then main params rebuilt from it;
  // the optimizer state of the trainer stays (no moments or momentum are loaded).
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

// A copy of the saved step directory whose .metadata.json is `edit`ed (its checksum rewritten
// to match, so that the edit reaches restore's own checks).
std::string edited_copy(const std::string& saved, const std::string& dst,
                        const std::function<void(nlohmann::json&)>& edit) {
  std::filesystem::remove_all(dst);
  std::filesystem::copy(saved, dst, std::filesystem::copy_options::recursive);
  std::ifstream in(dst + "/.metadata.json");
  nlohmann::json json = nlohmann::json::parse(in);
  edit(json);
  test_support::rewrite_metadata(dst, json);
  return dst;
}

// A checkpoint written before the rope scaling keys existed (state.config without them)
// restores while they have their defaults; with llama3 scaling it is another model.
TEST_F(CheckpointingTest, KeysNewerThanTheCheckpointCountOnlyAwayFromTheirDefaults) {
  const std::string old = edited_copy(saved_, (dir_ / "old").string(), [](nlohmann::json& j) {
    nlohmann::json& config = j["state"]["config"];
    for (const char* key :
         {"model.rope_scaling", "model.rope_scaling_factor", "model.rope_low_freq_factor",
          "model.rope_high_freq_factor", "model.rope_original_max_seq_len"}) {
      ASSERT_EQ(config.erase(key), 1u) << key;
    }
    const std::string text = config.dump();  // the hash checkpoint_state.cpp checks
    j["state"]["config_hash"] = format_xxh3_64(XXH3_64bits(text.data(), text.size()));
  });
  CheckpointParts parts{trainer_->model(), trainer_->sharded(),  trainer_->optimizer(),
                        trainer_->data(),  trainer_->resolved(), trainer_->mesh()};
  EXPECT_EQ(restore_checkpoint(parts, old, true), 1);
  trainer_ = make_trainer({"model.rope_scaling=llama3"});
  expect_refused(old,
                 {"another model", "model.rope_scaling: (absent) in the checkpoint, llama3 now"});
}

// Every non-tensor field malformed (wrong type, out of range, cut short, missing) is refused
// before anything changes, in one DataError naming the file and the field: model, optimizer
// state, data position and RNG state unchanged bit for bit.
TEST_F(CheckpointingTest, EachMalformedStateFieldIsRefusedByName) {
  using json = nlohmann::json;
  const std::string rng = CheckpointReader(saved_).metadata().state["ranks"][0]["rng_cpu"];
  const std::string config_key = "model.hidden_size";
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& j) { j["state"]["data"]["position"] = "4"; },
       "state.data.position: must be an integer, got \"4\""},
      {[](json& j) { j["state"]["data"]["position"] = -4; }, "state.data.position: must be >= 0"},
      {[](json& j) { j["state"]["data"]["position"] = 4.5; }, "state.data.position: must be an"},
      {[](json& j) { j["state"]["data"].erase("description"); }, "state.data.description: missing"},
      {[](json& j) { j["state"].erase("data"); }, "state.data: missing"},
      {[](json& j) { j["state"]["train"]["step"] = "1"; }, "state.train.step: must be an integer"},
      {[](json& j) { j["state"]["train"]["step"] = 2; },
       "state.train.step: 2 but the checkpoint's step is 1"},
      {[](json& j) { j["state"]["train"] = 1; }, "state.train: must be an object"},
      {[](json& j) {
         j["state"]["loss_scaler"] = {
             {"scale", "big"}, {"growth_tracker", 0}, {"skipped_steps", 0}};
       },
       "state.loss_scaler.scale: must be a number"},
      {[](json& j) {
         j["state"]["loss_scaler"] = {{"scale", 0.0}, {"growth_tracker", 0}, {"skipped_steps", 0}};
       },
       "state.loss_scaler.scale: must be > 0"},
      {[](json& j) {
         j["state"]["loss_scaler"] = {
             {"scale", 8.0}, {"growth_tracker", 1.5}, {"skipped_steps", 0}};
       },
       "state.loss_scaler.growth_tracker: must be an integer"},
      {[](json& j) {
         j["state"]["loss_scaler"] = {{"scale", 8.0}, {"growth_tracker", 0}};
       },
       "state.loss_scaler.skipped_steps: missing"},
      {[&](json& j) { j["state"]["ranks"][0]["rng_cpu"] = rng.substr(0, 1000); },
       "state.ranks[0].rng_cpu: must be " + std::to_string(rng.size()) + " hex digits"},
      {[&](json& j) { j["state"]["ranks"][0]["rng_cpu"] = "zz" + rng.substr(2); },
       "state.ranks[0].rng_cpu: character 0 is not a hex digit"},
      {[&](json& j) { j["state"]["ranks"][0]["rng_cpu"] = std::string(rng.size(), '0'); },
       "state.ranks[0].rng_cpu: is not a valid CPU generator state"},
      {[](json& j) { j["state"]["ranks"][0]["rng_cpu"] = 7; },
       "state.ranks[0].rng_cpu: must be a string"},
      {[](json& j) { j["state"]["ranks"] = "all"; }, "state.ranks: must be a list"},
      {[](json& j) { j["state"]["lr_schedule"]["warmup_steps"] = "0"; },
       "state.lr_schedule.warmup_steps: must be an integer"},
      {[](json& j) { j["state"]["lr_schedule"]["min_lr_ratio"] = nullptr; },
       "state.lr_schedule.min_lr_ratio: must be a number"},
      {[&](json& j) { j["state"]["config"][config_key] = 24; },
       "state.config." + config_key + ": must be a string, got 24"},
      {[&](json& j) { j["state"]["config"][config_key] = "32"; },
       "state.config_hash: "},  // an edited config no longer matches its hash
      {[](json& j) { j["state"]["config_hash"] = "0123"; },
       "state.config_hash: \"0123\" is not 16 hex digits"},
      {[](json& j) { j["state"]["optimizer"]["saved"] = "yes"; },
       "state.optimizer.saved: must be true or false"},
      {[](json& j) { j["state"]["optimizer"]["fp32_main_params"] = 1; },
       "state.optimizer.fp32_main_params: must be true or false"},
      {[](json& j) { j["state"]["optimizer"]["param_groups"] = json::object(); },
       "state.optimizer.param_groups: must be a list"},
      {[](json& j) { j["state"]["optimizer"]["param_groups"][0] = 3; },
       "state.optimizer.param_groups[0]: must be an object"},
      {[](json& j) { j["state"]["optimizer"]["param_groups"][0]["base_lr"] = "0.1"; }, "base_lr"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i) + ": " + cases[i].second);
    const std::string path =
        edited_copy(saved_, (dir_ / ("edited" + std::to_string(i))).string(), cases[i].first);
    const int64_t position = trainer_->data().position();
    const std::string rng_before = cpu_rng_state_hex();
    expect_refused(path, {path + "/.metadata.json", cases[i].second, "nothing was changed"});
    EXPECT_EQ(trainer_->data().position(), position);
    EXPECT_EQ(cpu_rng_state_hex(), rng_before);
  }
}

// Plan, agree, apply: a checkpoint with problems of different kinds (a model tensor's shape,
// a non-tensor field, a leaf's state value) is refused with every one named in one error.
TEST_F(CheckpointingTest, EveryProblemOfACheckpointIsNamedInOneError) {
  const std::string step_key = std::string(kOptimizerStatePrefix) + "lm_head.weight.step";
  const std::string edited = copy("several", [&](const std::string& key, at::Tensor t) {
    if (key == "model.lm_head.weight") return t.narrow(0, 0, t.size(0) - 1).contiguous();
    return key == step_key ? at::scalar_tensor(1.5, at::kFloat) : t;
  });
  const std::string path =
      edited_copy(edited, (dir_ / "several_edited").string(),
                  [](nlohmann::json& j) { j["state"]["data"]["position"] = "4"; });
  const int64_t position = trainer_->data().position();
  expect_refused(path,
                 {path + "/.metadata.json: state.data.position: must be an integer, got \"4\"",
                  "model.lm_head.weight: shape [36, 24] in the checkpoint, [37, 24]",
                  step_key.substr(0, step_key.size() - 5) +
                      ": adamw: 'step' must be one whole number >= 0, got 1.5",
                  "nothing was changed"});
  EXPECT_EQ(trainer_->data().position(), position);
}

// torch.optim saves `step` as a float tensor: a whole-number float step restores as the
// integer it holds (LeafOptimizer::check_state), the same state as the int64 one.
TEST_F(CheckpointingTest, AStepSavedAsAWholeNumberFloatRestores) {
  const std::string path = copy("float_step", [](const std::string& key, at::Tensor t) {
    const bool step = key.rfind(kOptimizerStatePrefix, 0) == 0 && key.size() > 5 &&
                      key.compare(key.size() - 5, 5, ".step") == 0;
    return step ? t.to(at::kFloat) : t;
  });
  ASSERT_EQ(CheckpointReader(path)
                .metadata()
                .tensors.at(std::string(kOptimizerStatePrefix) + "lm_head.weight.step")
                .dtype,
            at::kFloat);
  CheckpointParts parts{trainer_->model(), trainer_->sharded(),  trainer_->optimizer(),
                        trainer_->data(),  trainer_->resolved(), trainer_->mesh()};
  EXPECT_EQ(restore_checkpoint(parts, path, true), 1);
  auto fresh = make_trainer({"checkpoint.restore_from=" + saved_});
  test_support::expect_bitwise_equal(snapshot(*trainer_), snapshot(*fresh));
}

// A data position the dataset cannot resume at is refused before anything changes: 3 windows
// with 2 data-parallel ranks (seek's own rule: a multiple of the rank count), checked by the
// dataset itself through a seek that is put back. A 2-rank dataset in this one process is
// enough: the position check is the dataset's, not the mesh's.
TEST_F(CheckpointingTest, ADataPositionTheDatasetCannotResumeAtChangesNothing) {
  const TrainerConfig& config = trainer_->resolved().config;
  auto two_ranks = make_dataset(config.data, config.model.vocab_size, 0, /*dp_rank=*/0,
                                /*dp_size=*/2);
  CheckpointParts parts{trainer_->model(), trainer_->sharded(),  trainer_->optimizer(),
                        *two_ranks,        trainer_->resolved(), trainer_->mesh()};
  const std::string odd = edited_copy(saved_, (dir_ / "odd").string(),
                                      [](auto& j) { j["state"]["data"]["position"] = 3; });
  two_ranks->next_batch(1, 8);  // position 2
  const NamedTensors before = snapshot(*trainer_);
  try {
    restore_checkpoint(parts, odd, true);
    ADD_FAILURE() << "position 3 with 2 ranks should be refused";
  } catch (const DataError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(odd + "/.metadata.json: state.data.position: "), std::string::npos)
        << message;
    EXPECT_NE(message.find("cannot resume at position 3 with 2 data-parallel ranks"),
              std::string::npos)
        << message;
  }
  test_support::expect_bitwise_equal(snapshot(*trainer_), before);
  EXPECT_EQ(two_ranks->position(), 2);

  const std::string even = edited_copy(saved_, (dir_ / "even").string(),
                                       [](auto& j) { j["state"]["data"]["position"] = 6; });
  EXPECT_EQ(restore_checkpoint(parts, even, true), 1);
  EXPECT_EQ(two_ranks->position(), 6);
}

// One value of .metadata.json changed at random (seeded: the same 60 edits every run), half of
// them in the non-tensor state, half in the rest (format fields, tensors, chunks): a restore
// either succeeds or fails with one DataError that changed nothing; never another exception
// (a JSON type error, LibTorch's generator message: "internal error" at the command line).
TEST_F(CheckpointingTest, RandomMetadataEditsGiveADataErrorOrARestore) {
  using json = nlohmann::json;
  json good;
  {
    std::ifstream in(saved_ + "/.metadata.json");
    good = json::parse(in);
  }
  const json flat = good.flatten();
  std::map<std::string, std::vector<std::string>> state_leaves;  // by top-level state field
  std::vector<std::string> other_leaves;
  for (const auto& [pointer, value] : flat.items()) {
    if (pointer.rfind("/state/", 0) == 0) {
      state_leaves[pointer.substr(7, pointer.find('/', 7) - 7)].push_back(pointer);
    } else {
      other_leaves.push_back(pointer);
    }
  }
  ASSERT_GE(state_leaves.size(), 7u);  // train, lr_schedule, data, optimizer, config, hash, ranks
  std::mt19937 rng(20261201);
  auto pick = [&](const std::vector<std::string>& from) { return from[rng() % from.size()]; };
  // Half the edits keep the type (an integer + 1, a number doubled, a string one character
  // shorter, a bool flipped: values that may well be accepted), half change it.
  auto mutate = [&](const json& value) -> json {
    if (rng() % 2 == 0) {
      if (value.is_number_integer()) return value.get<int64_t>() + 1;
      if (value.is_number()) return value.get<double>() * 2;
      if (value.is_string()) {
        const std::string s = value.get<std::string>();
        return s.empty() ? std::string("a") : s.substr(0, s.size() - 1);
      }
      if (value.is_boolean()) return !value.get<bool>();
    }
    switch (rng() % 7) {
      case 0:
        return "x";
      case 1:
        return -3;
      case 2:
        return 1.5;
      case 3:
        return nullptr;
      case 4:
        return true;
      case 5:
        return json::object();
      default:
        return 18446744073709551615ull;
    }
  };
  int refused = 0, restored = 0;
  CheckpointParts parts{trainer_->model(), trainer_->sharded(),  trainer_->optimizer(),
                        trainer_->data(),  trainer_->resolved(), trainer_->mesh()};
  for (int trial = 0; trial < 60; ++trial) {
    std::string pointer;
    if (trial % 2 == 0) {
      auto field = state_leaves.begin();
      std::advance(field, rng() % state_leaves.size());
      pointer = pick(field->second);
    } else {
      pointer = pick(other_leaves);
    }
    const json replacement = mutate(flat.at(pointer));
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + pointer + " = " + replacement.dump());
    const std::string path = edited_copy(saved_, (dir_ / "mutated").string(), [&](json& j) {
      j[json::json_pointer(pointer)] = replacement;
    });
    const NamedTensors before = snapshot(*trainer_);
    try {
      restore_checkpoint(parts, path, /*restore_optimizer=*/true);
      ++restored;
    } catch (const DataError& error) {
      ++refused;
      EXPECT_NE(std::string(error.what()).find("nothing was changed"), std::string::npos)
          << error.what();
      test_support::expect_bitwise_equal(snapshot(*trainer_), before);
    } catch (const std::exception& error) {
      ADD_FAILURE() << "not a DataError: " << error.what();
    }
  }
  // Both outcomes occur with this seed (the counts are printed for the record).
  EXPECT_GT(refused, 0);
  EXPECT_GT(restored, 0);
  std::cout << refused << " of 60 edits refused, " << restored << " restored\n";
}

// ---- Tensor-parallel boxes ----

struct TpTensor {
  std::string key;
  std::vector<int64_t> shape;
  int64_t tp_dim;
};
// Column-parallel, row-parallel (each tp slice split in dp_shard rows) and tp-whole.
const std::vector<TpTensor> kTpTensors = {
    {"model.col.weight", {8, 6}, 0}, {"model.row.weight", {4, 10}, 1}, {"model.norm", {6}, -1}};

at::Tensor tp_global(size_t i) {
  at::manual_seed(static_cast<uint64_t>(70 + i));
  return at::randn(kTpTensors[i].shape);
}

// This rank's placement of kTpTensors[i] on `mesh` (dp_shard rows of the tp slice).
ParamPlacement tp_box_placement(const DeviceMesh& mesh, size_t i) {
  ParamPlacement p = whole_placement(kTpTensors[i].key, kTpTensors[i].shape);
  p.kind = ParamPlacement::Kind::kDim0Shard;
  p.tp_dim = kTpTensors[i].tp_dim;
  p.tp_group = mesh.tp_group;
  p.shard_group = mesh.dp_shard_group;
  p.rows = p.tp_shape()[0] / mesh.dp_shard;
  p.offset = mesh.shard_index() * p.rows;
  return p;
}

at::Tensor box(const at::Tensor& full, const std::vector<int64_t>& offsets,
               const std::vector<int64_t>& sizes) {
  at::Tensor out = full;
  for (size_t d = 0; d < sizes.size(); ++d) out = out.narrow(d, offsets[d], sizes[d]);
  return out.contiguous();
}

// Reads `from` (a one-process save) as this rank's boxes, then saves the boxes to `to`.
MIXTRAIN_WORKER(checkpoint_tp_boxes) {
  DeviceMesh mesh = worker.make_mesh();
  CheckpointReader reader(resolve_step_dir(worker.get("TP_FROM")));
  SaveRequest request;
  request.step = 2;
  request.mesh = CheckpointMesh{mesh.dp_replicate, mesh.dp_shard, mesh.ep};
  request.state = nlohmann::json::object();
  for (size_t i = 0; i < kTpTensors.size(); ++i) {
    const ParamPlacement p = tp_box_placement(mesh, i);
    const at::Tensor mine = box(tp_global(i), p.global_offsets(), p.local_sizes());
    const at::Tensor read = reader.read(kTpTensors[i].key, p.global_offsets(), p.local_sizes());
    EXPECT_TRUE(at::equal(read, mine)) << kTpTensors[i].key << " rank " << mesh.rank;
    request.chunks.push_back({kTpTensors[i].key, mine, p.global_shape, p.global_offsets()});
  }
  CheckpointSaver saver(worker.get("TP_TO"), 1, false, mesh.world);
  saver.save(std::move(request));
}

TEST(CheckpointTensorParallelBoxes, OneToTpTwoByDpTwoAndBackToOne) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("mixtrain_checkpoint_tp_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  {
    SaveRequest whole;
    whole.step = 1;
    whole.state = nlohmann::json::object();
    for (size_t i = 0; i < kTpTensors.size(); ++i) {
      const at::Tensor t = tp_global(i);
      whole.chunks.push_back(
          {kTpTensors[i].key, t, t.sizes().vec(), std::vector<int64_t>(t.dim(), 0)});
    }
    CheckpointSaver saver((dir / "one").string(), 1, false, make_local_collectives());
    saver.save(std::move(whole));
  }
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  parallel.tp = 2;
  const auto result =
      testing::run_workers("checkpoint_tp_boxes", 4, parallel,
                           {{"TP_FROM", (dir / "one").string()}, {"TP_TO", (dir / "tp").string()}});
  ASSERT_TRUE(result.all_ok()) << result.summary();
  CheckpointReader reader(resolve_step_dir((dir / "tp").string()));
  for (size_t i = 0; i < kTpTensors.size(); ++i) {
    EXPECT_TRUE(at::equal(reader.read_full(kTpTensors[i].key), tp_global(i))) << kTpTensors[i].key;
  }
  // The tp-whole tensor's two copies per shard are written once: one chunk per dp_shard rank.
  EXPECT_EQ(reader.metadata().tensors.at("model.norm").chunks.size(), 2u);
  EXPECT_EQ(reader.metadata().tensors.at("model.col.weight").chunks.size(), 4u);
  std::filesystem::remove_all(dir);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
