// trainer/trainer: a TrainerConfig that did not come from a file (built in C++) meets the same
// validation as a loaded one, fp32-main-params §2.5 included, and trains like its loaded twin;
// warnings about valid but surprising settings are logged once at start. One process, the tiny
// model.
#include "mixtrain/trainer/trainer.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/model/causal_lm.h"
#include "support/tiny_model_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("mixtrain_trainer_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // configs/qwen2_moe_tiny.yaml's fp32-main-params setup (bfloat16 model and compute, fp32 main
  // params, Muon + AdamW) on the tiny model, built field by field, without reduce_dtype.
  static TrainerConfig built_in_code() {
    TrainerConfig c;
    c.model = test_support::tiny_config();
    c.model_init_dtype = "bfloat16";
    c.mix_precision.param_dtype = "bfloat16";
    c.optimizer.target = "Muon";
    c.optimizer.fp32_main_params = true;
    c.data.seq_len = 8;
    c.data.micro_batch_size = 2;
    c.data.global_batch_size = 2;
    c.train.steps = 2;
    return c;
  }
  // The same settings as a YAML file, through load_config.
  std::string as_yaml_file() const {
    const std::string path = (dir_ / "same.yaml").string();
    std::ofstream(path) << "model_init_dtype: bfloat16\n"
                           "model:\n  vocab_size: 37\n  hidden_size: 24\n  num_layers: 2\n"
                           "  num_heads: 4\n  num_kv_heads: 2\n  head_dim: 8\n"
                           "  moe_intermediate_size: 12\n  num_experts: 4\n"
                           "  num_experts_per_tok: 2\n  shared_expert_intermediate_size: 20\n"
                           "  max_seq_len: 16\n  router_aux_loss_coef: 0.01\n"
                           "data:\n  seq_len: 8\n  micro_batch_size: 2\n  global_batch_size: 2\n"
                           "train:\n  steps: 2\n"
                           "optimizer:\n  _target_: Muon\n  fp32_main_params: true\n"
                           "fsdp_config:\n  mix_precision:\n    param_dtype: bfloat16\n"
                           "    reduce_dtype: float32\n";
    return path;
  }

  std::filesystem::path dir_;
  DeviceMesh mesh_ = make_single_process_mesh();
};

const char* const kCase25 =
    "TrainerConfig (built in code): optimizer.fp32_main_params: true requires "
    "fsdp_config.mix_precision.reduce_dtype: float32 (it is not set); set it explicitly, it is "
    "never changed automatically";

TEST_F(TrainerTest, ConfigBuiltInCodeWithoutReduceDtypeIsRefused) {
  ResolvedConfig resolved;
  resolved.config = built_in_code();
  try {
    Trainer trainer(resolved, mesh_, dir_.string());
    ADD_FAILURE() << "a config without reduce_dtype was accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()), kCase25);
  }
  // `mixtrain train`'s entry point refuses it before joining ranks or writing anything.
  TrainOptions options;
  options.run_dir = (dir_ / "run").string();
  try {
    run_training(resolved, options);
    ADD_FAILURE() << "run_training accepted a config without reduce_dtype";
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()), kCase25);
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run"));
  EXPECT_FALSE(resolved.config.mix_precision.reduce_dtype.has_value());
}

// Refusals only a build step can make carry the canonical key apart from the problem
// (core/error.h ConfigKey); the CLI spells the key as the user wrote it (cli_test.cpp).
TEST_F(TrainerTest, BuildStepRefusalsCarryTheCanonicalKey) {
  // float16 without fp32 main params: a valid config this build cannot train.
  ResolvedConfig half;
  half.config = built_in_code();
  half.config.model_init_dtype = "float16";
  half.config.optimizer.fp32_main_params = false;
  TrainOptions options;
  options.run_dir = (dir_ / "run").string();
  try {
    run_training(half, options);
    ADD_FAILURE() << "a float16 model without fp32 main params was accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key(), "optimizer.fp32_main_params");
    EXPECT_EQ(error.problem(),
              "float16 models need fp32 main params and loss scaling; set it to true");
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run"));

  // A swap directory that cannot be made (its parent is a file): exit code 1, on swap_dir.
  ResolvedConfig swap;
  swap.config = built_in_code();
  swap.config.mix_precision.reduce_dtype = "float32";
  swap.config.optimizer.swap_optimizer = true;
  std::ofstream(dir_ / "a_file") << "x";
  swap.config.optimizer.swap_dir = (dir_ / "a_file" / "swap").string();
  try {
    Trainer trainer(swap, mesh_, dir_.string());
    ADD_FAILURE() << "a swap_dir under a file was accepted";
  } catch (const UserError& error) {
    EXPECT_EQ(error.exit_code(), 1);
    EXPECT_EQ(error.key(), "optimizer.swap_dir");
    EXPECT_EQ(error.problem().rfind("swap optimizer: cannot create the directory " +
                                        swap.config.optimizer.swap_dir + ": ",
                                    0),
              0u)
        << error.problem();
  }
}

// The launched world must be dp_replicate x dp_shard ranks: known only from the launcher's
// variables, so join_mesh refuses it, on parallel.dp_shard, before any connection.
TEST_F(TrainerTest, WorldSizeOtherThanTheDegreesIsRefusedOnDpShard) {
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "4", 1);
  TrainerConfig config = built_in_code();
  config.parallel.dp_shard = 2;
  std::string key, problem;
  try {
    join_mesh(config);
  } catch (const ConfigError& error) {
    key = error.key();
    problem = error.problem();
  }
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  EXPECT_EQ(key, "parallel.dp_shard");
  EXPECT_EQ(problem,
            "2 x the replicate degree 1 x cp 1 x tp 1 = 2 ranks, but the launcher started 4");
}

// Two steps each, one trainer after the other (each seeds the global generator when built).
struct TwoSteps {
  std::vector<StepResult> steps;
  at::Tensor lm_head_before, lm_head_after;
};
TwoSteps two_steps(const ResolvedConfig& resolved, const DeviceMesh& mesh,
                   const std::string& run_dir) {
  Trainer trainer(resolved, mesh, run_dir);
  TwoSteps out;
  out.lm_head_before = trainer.model().named_parameters()["lm_head.weight"].detach().clone();
  for (int i = 0; i < 2; ++i) out.steps.push_back(trainer.step());
  out.lm_head_after = trainer.model().named_parameters()["lm_head.weight"].detach().clone();
  return out;
}

TEST_F(TrainerTest, ValidConfigBuiltInCodeTrainsLikeTheSameConfigFromAFile) {
  ResolvedConfig in_code;
  in_code.config = built_in_code();
  in_code.config.mix_precision.reduce_dtype = "float32";
  const TwoSteps a = two_steps(in_code, mesh_, (dir_ / "a").string());
  const TwoSteps b = two_steps(load_config(as_yaml_file(), {}), mesh_, (dir_ / "b").string());
  for (size_t i = 0; i < 2; ++i) {
    const StepResult& ra = a.steps[i];
    EXPECT_EQ(ra.step, static_cast<int64_t>(i + 1));
    EXPECT_TRUE(std::isfinite(ra.loss) && ra.grad_norm > 0) << ra.loss << " " << ra.grad_norm;
    // Same settings, same seed: the same computation, bit for bit.
    EXPECT_EQ(ra.loss, b.steps[i].loss) << "step " << i + 1;
    EXPECT_EQ(ra.grad_norm, b.steps[i].grad_norm) << "step " << i + 1;
  }
  EXPECT_EQ(a.lm_head_after.scalar_type(), at::kBFloat16);
  EXPECT_FALSE(a.lm_head_after.equal(a.lm_head_before));  // the optimizer updated the model
  EXPECT_TRUE(a.lm_head_after.equal(b.lm_head_after));
}

// muon_hybrid_ns with muon_ns_steps <= 8 is plain legacy: one warning at start naming both keys.
TEST_F(TrainerTest, HybridWithFewStepsWarnsOnceAtStart) {
  const std::string toml = MIXTRAIN_SOURCE_DIR "/configs/qwen2_moe_tiny.toml";
  const std::string warning =
      "optimizer.muon_hybrid_ns = true with optimizer.muon_ns_steps = 5 runs plain legacy";
  auto start_log = [&](const std::string& ns_steps) {
    const ResolvedConfig resolved = load_config(toml, {"optimizer.muon_ns_steps=" + ns_steps});
    ::testing::internal::CaptureStderr();
    Trainer trainer(resolved, mesh_, dir_.string());
    return ::testing::internal::GetCapturedStderr();
  };
  const std::string five = start_log("5");
  const size_t first = five.find(warning);
  ASSERT_NE(first, std::string::npos) << five;
  EXPECT_EQ(five.find(warning, first + 1), std::string::npos) << "warned more than once";
  EXPECT_EQ(start_log("10").find("runs plain legacy"), std::string::npos);  // the example's 10
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
