// fp32-main-params fp32-main-params §2.4 and section 9.3 (bfloat16 model, Muon + AdamW or AdamW
// only, 1 and 2 FSDP ranks), with real checkpoints of both kinds:
// 1. branch 2: a plain checkpoint, saved by a run with fp32_main_params: false (its optimizer
//    state is bfloat16, it has no main params), resumed with fp32_main_params: true: the
//    model and the original state load (the state widened to the float32 the new optimizer
//    keeps, exactly), the main params are rebuilt from the loaded model, and exactly one
//    warning names the mantissa bits that cannot be restored;
// 2. the reverse: a main-params checkpoint resumed with fp32_main_params: false: the model
//    continues from its saved bfloat16 params, the float32 state is rounded to bfloat16 (as
//    torch.optim.Optimizer.load_state_dict casts state to the param's dtype), the main params
//    are not used, and exactly one warning says so;
// 3. branch 3: a checkpoint with only some main params is damaged data: the restore fails
//    listing the missing parameter names, and the trainer's model and optimizer state are
//    untouched.
// In 1 and 2 the next step's loss equals the saving run's next step bit for bit: the loss
// reads only the bfloat16 model params (restored exactly), the data position and the RNG.
#include <gtest/gtest.h>

#include <filesystem>

#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/trainer/checkpointing.h"
#include "support/checkpoint_surgery.h"
#include "support/multiprocess.h"
#include "support/scoped_temp_dir.h"
#include "support/trainer_probe.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using test_support::as_map;
using testing::run_workers;
using testing::WorkerResult;

bool is_main_key(const std::string& key) {
  return key.rfind(kMainParamPrefix, 0) == 0;
}

// The tiny config with fp32 main params on or off, Muon + AdamW ("muon") or AdamW only.
ResolvedConfig config_for(const std::string& optimizer, bool fp32_main_params, int dp_shard,
                          const std::string& ckpt_dir, const std::string& restore_from) {
  std::vector<std::string> overrides = {
      "parallel.dp_shard=" + std::to_string(dp_shard), "checkpoint.dir=" + ckpt_dir,
      std::string("optimizer.fp32_main_params=") + (fp32_main_params ? "true" : "false")};
  if (optimizer == "adamw") overrides.push_back("optimizer._target_=AdamW");
  if (!restore_from.empty()) overrides.push_back("checkpoint.restore_from=" + restore_from);
  return test_support::checkpoint_test_config(overrides);
}

void write_on_rank0(const testing::WorkerEnv& worker, const std::string& name,
                    const NamedTensors& tensors) {
  if (worker.rank.rank == 0) write_safetensors((worker.dir / name).string(), tensors);
}

// Trains 2 steps with FP32=<fp32_main_params of the saving run>, saves to CKPT, records the
// state and model at the save and the next step.
MIXTRAIN_WORKER(case_2_4_save) {
  DeviceMesh mesh = worker.make_mesh();
  Trainer trainer(config_for(worker.get("OPT"), worker.get("FP32") == "true",
                             worker.parallel.dp_shard, worker.get("CKPT"), ""),
                  mesh, worker.dir.string());
  trainer.step();
  trainer.step();
  trainer.save_checkpoint();
  write_on_rank0(worker, "saved_state.safetensors", test_support::whole_optimizer_state(trainer));
  write_on_rank0(worker, "saved_model.safetensors", test_support::whole_model_params(trainer));
  write_on_rank0(worker, "saved_next.safetensors", test_support::recorded_step(trainer));
}

// Resumes CKPT with fp32_main_params = !FP32; records warnings, state, model and next step.
MIXTRAIN_WORKER(case_2_4_resume) {
  DeviceMesh mesh = worker.make_mesh();
  const int warnings_before = warning_count();
  Trainer trainer(
      config_for(worker.get("OPT"), worker.get("FP32") != "true", worker.parallel.dp_shard,
                 worker.get("CKPT") + "_resumed", worker.get("CKPT")),
      mesh, worker.dir.string());
  EXPECT_EQ(trainer.completed_steps(), 2);
  if (worker.rank.rank == 0) {
    worker.write_text("warnings", std::to_string(warning_count() - warnings_before));
  }
  write_on_rank0(worker, "restored_state.safetensors",
                 test_support::whole_optimizer_state(trainer));
  write_on_rank0(worker, "restored_model.safetensors", test_support::whole_model_params(trainer));
  write_on_rank0(worker, "restored_next.safetensors", test_support::recorded_step(trainer));
}

struct Runs {
  WorkerResult saved, resumed;
  std::map<std::string, at::Tensor> read(const WorkerResult& run, const std::string& name) const {
    return as_map(read_safetensors((run.dir() / name).string()).tensors);
  }
};

// Saves with fp32_main_params = saved_with_main_params, resumes with the opposite.
Runs save_and_resume(const std::string& optimizer, bool saved_with_main_params, int nproc) {
  // CKPT and CKPT_resumed (the resumed run's checkpoint.dir), removed however this ends.
  const test_support::ScopedTempDir dir("mixtrain_case_2_4_" + optimizer + std::to_string(nproc) +
                                        "_");
  const std::filesystem::path ckpt = dir.path() / "checkpoints";
  ParallelConfig parallel;
  parallel.dp_shard = nproc;
  const std::map<std::string, std::string> env = {
      {"CKPT", ckpt.string()},
      {"OPT", optimizer},
      {"FP32", saved_with_main_params ? "true" : "false"}};
  Runs runs;
  runs.saved = run_workers("case_2_4_save", nproc, parallel, env);
  EXPECT_TRUE(runs.saved.all_ok()) << runs.saved.summary();
  if (runs.saved.all_ok()) {
    runs.resumed = run_workers("case_2_4_resume", nproc, parallel, env);
    EXPECT_TRUE(runs.resumed.all_ok()) << runs.resumed.summary();
  }
  return runs;
}

// The loss of the next step reads only the (exactly restored) bfloat16 model params, the data
// position and the RNG: bitwise the saving run's.
void expect_same_next_loss(const Runs& runs) {
  const auto saved = runs.read(runs.saved, "saved_next.safetensors");
  const auto restored = runs.read(runs.resumed, "restored_next.safetensors");
  EXPECT_TRUE(restored.at("loss").equal(saved.at("loss")))
      << restored.at("loss").item<double>() << " vs " << saved.at("loss").item<double>();
}

class Branch2 : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Branch2, PlainBfloat16CheckpointResumesWithMainParams) {
  const auto [optimizer, nproc] = GetParam();
  const Runs runs = save_and_resume(optimizer, /*saved_with_main_params=*/false, nproc);
  if (!runs.resumed.all_ok()) return;  // reported above
  EXPECT_EQ(runs.resumed.read_text("warnings"), "1") << runs.resumed.outputs[0];
  const std::string log = runs.resumed.outputs[0];
  EXPECT_NE(log.find("mantissa bits the low-precision model lost cannot be restored"),
            std::string::npos)
      << log;

  const auto saved_state = runs.read(runs.saved, "saved_state.safetensors");
  const auto saved_model = runs.read(runs.saved, "saved_model.safetensors");
  const auto state = runs.read(runs.resumed, "restored_state.safetensors");
  const auto model = runs.read(runs.resumed, "restored_model.safetensors");
  // The plain run kept its moments in bfloat16 and has no main params: a real plain checkpoint.
  int64_t bfloat16_state = 0, muon_state = 0;
  for (const auto& [key, t] : saved_state) {
    EXPECT_FALSE(is_main_key(key)) << key;
    bfloat16_state += t.scalar_type() == at::kBFloat16;
    muon_state += key.size() > 16 && key.compare(key.size() - 16, 16, ".momentum_buffer") == 0;
  }
  EXPECT_GT(bfloat16_state, 0);
  EXPECT_EQ(muon_state > 0, optimizer == "muon") << "the run must use the optimizer it names";
  // Model params bit for bit.
  test_support::expect_bitwise_equal(NamedTensors(model.begin(), model.end()),
                                     NamedTensors(saved_model.begin(), saved_model.end()));
  int64_t mains = 0;
  for (const auto& [key, t] : state) {
    if (is_main_key(key)) {
      // Rebuilt from the loaded bfloat16 model param: exactly its float32 value.
      ++mains;
      const std::string fqn = key.substr(std::string(kMainParamPrefix).size());
      EXPECT_EQ(t.scalar_type(), at::kFloat) << key;
      EXPECT_TRUE(t.equal(saved_model.at("model." + fqn).to(at::kFloat))) << key;
      continue;
    }
    // Original state, widened to the float32 the new optimizer keeps (bfloat16 -> float32 is
    // exact: the same sign, exponent and the top 7 mantissa bits); step counters as saved.
    ASSERT_TRUE(saved_state.count(key)) << key;
    const at::Tensor& was = saved_state.at(key);
    EXPECT_EQ(t.scalar_type(), was.scalar_type() == at::kBFloat16 ? at::kFloat : was.scalar_type())
        << key;
    EXPECT_TRUE(t.equal(was.to(t.scalar_type()))) << key;
  }
  EXPECT_EQ(mains, static_cast<int64_t>(saved_model.size()));
  EXPECT_EQ(state.size(), saved_state.size() + saved_model.size());
  expect_same_next_loss(runs);
}

TEST_P(Branch2, MainParamsCheckpointResumesWithoutThem) {
  const auto [optimizer, nproc] = GetParam();
  const Runs runs = save_and_resume(optimizer, /*saved_with_main_params=*/true, nproc);
  if (!runs.resumed.all_ok()) return;
  EXPECT_EQ(runs.resumed.read_text("warnings"), "1") << runs.resumed.outputs[0];
  const std::string log = runs.resumed.outputs[0];
  EXPECT_NE(log.find("fp32_main_params is off"), std::string::npos) << log;
  EXPECT_NE(log.find("float32 to bfloat16"), std::string::npos) << log;
  EXPECT_NE(log.find("mantissa bits"), std::string::npos) << log;

  const auto saved_state = runs.read(runs.saved, "saved_state.safetensors");
  const auto saved_model = runs.read(runs.saved, "saved_model.safetensors");
  const auto state = runs.read(runs.resumed, "restored_state.safetensors");
  const auto model = runs.read(runs.resumed, "restored_model.safetensors");
  test_support::expect_bitwise_equal(NamedTensors(model.begin(), model.end()),
                                     NamedTensors(saved_model.begin(), saved_model.end()));
  int64_t rounded = 0, saved_mains = 0;
  for (const auto& [key, was] : saved_state) {
    if (is_main_key(key)) {
      ++saved_mains;
      EXPECT_FALSE(state.count(key)) << key << ": the run without main params has none";
      continue;
    }
    ASSERT_TRUE(state.count(key)) << key;
    const at::Tensor& t = state.at(key);
    if (was.scalar_type() == at::kFloat) {
      // Rounded to nearest even, as at::Tensor::to (and torch) casts.
      EXPECT_EQ(t.scalar_type(), at::kBFloat16) << key;
      EXPECT_TRUE(t.equal(was.to(at::kBFloat16))) << key;
      rounded += t.to(at::kFloat).ne(was).sum().item<int64_t>();
    } else {
      EXPECT_TRUE(t.equal(was)) << key;  // step counters
    }
  }
  EXPECT_EQ(saved_mains, static_cast<int64_t>(saved_model.size()));
  EXPECT_GT(rounded, 0) << "the test must hold state bits bfloat16 loses";
  EXPECT_EQ(state.size(), saved_state.size() - saved_mains);
  expect_same_next_loss(runs);
}

INSTANTIATE_TEST_SUITE_P(RfcCase24, Branch2,
                         ::testing::Combine(::testing::Values("muon", "adamw"),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "ranks";
                         });

// Branch 3, in one process: a trainer that saved at step 1 and moved on by a step.
TEST(RfcCase24, PartialMainParamsFailListingThemAndChangeNothing) {
  // Removed however the test ends.
  const test_support::ScopedTempDir scoped("mixtrain_case_2_4_partial_");
  const std::filesystem::path dir = scoped.path() / "run";
  const std::string ckpt_dir = (dir / "checkpoints").string();
  DeviceMesh mesh = make_single_process_mesh();
  Trainer trainer(config_for("muon", true, 1, ckpt_dir, ""), mesh, dir.string());
  trainer.step();
  trainer.save_checkpoint();
  const std::string saved = resolve_step_dir(trainer.checkpoint_dir());

  const std::string missing_a = "model.layers.0.self_attn.q_proj.weight";
  const std::string missing_b = "model.norm.weight";
  const std::string partial =
      test_support::copy_checkpoint(saved, (dir / "partial").string(), [&](const std::string& key) {
        return key != kMainParamPrefix + missing_a && key != kMainParamPrefix + missing_b;
      });
  trainer.step();
  auto snapshot = [&] {
    NamedTensors out = test_support::whole_model_params(trainer);
    for (const auto& [key, t] : test_support::whole_optimizer_state(trainer))
      out.emplace_back(key, t);
    return out;
  };
  const NamedTensors before = snapshot();

  CheckpointParts parts{trainer.model(), trainer.sharded(),  trainer.optimizer(),
                        trainer.data(),  trainer.resolved(), trainer.mesh()};
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
  test_support::expect_bitwise_equal(snapshot(), before);
  // And through the constructor: the same error, exit code of a data error.
  EXPECT_THROW(Trainer(config_for("muon", true, 1, ckpt_dir, partial), mesh, dir.string()),
               DataError);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
