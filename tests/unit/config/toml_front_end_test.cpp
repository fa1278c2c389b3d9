#include "mixtrain/config/toml_front_end.h"

#include <gtest/gtest.h>

#include "mixtrain/config/toml_reader.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/muon_config.h"
#include "unit/config/temp_config.h"
#include "unit/config/translated.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::Translated;

void toml_front_end(const std::string& path, TrainerConfig& config, Provenance& provenance) {
  translate_toml(read_toml_file(path), config, provenance);
}

Translated translate_text(const std::string& text) {
  return testing::translate_file("c.toml", text, toml_front_end);
}

std::string error_of(const std::string& text) {
  return testing::front_end_error("c.toml", text, toml_front_end);
}

TEST(TomlFrontEndTest, Example1MatchRmsAdamwDerivedValues) {
  const int warnings_before = warning_count();
  const Translated t = translate_text(testing::kMuonExample1Toml);
  EXPECT_EQ(warning_count(), warnings_before);  // no muon_lr, nothing to warn about
  const OptimizerConfig& o = t.config.optimizer;
  EXPECT_EQ(o.target, "Muon");
  EXPECT_EQ(o.options.get<torch::optim::AdamWOptions>().lr(), 2.2e-4);
  EXPECT_EQ(o.options.get<MuonConfig>().options.lr(), 2.2e-4);  // match_rms_adamw: Muon uses lr
  EXPECT_EQ(o.options.get<torch::optim::AdamWOptions>().weight_decay(), 0.1);
  EXPECT_EQ(o.options.get<MuonConfig>().options.weight_decay(), 0.1);  // shared
  EXPECT_EQ(o.options.get<torch::optim::AdamWOptions>().eps(), 1e-8);  // torchtitan default
  EXPECT_EQ(o.options.get<MuonConfig>().options.ns_epsilon(),
            1e-8);  // eps is also the Newton-Schulz epsilon
  EXPECT_EQ(std::get<0>(o.options.get<torch::optim::AdamWOptions>().betas()), 0.9);
  EXPECT_EQ(std::get<1>(o.options.get<torch::optim::AdamWOptions>().betas()), 0.95);
  EXPECT_EQ(o.options.get<MuonConfig>().options.momentum(), 0.95);
  EXPECT_TRUE(o.options.get<MuonConfig>().options.nesterov());
  EXPECT_EQ(o.options.get<MuonConfig>().options.ns_steps(), 10);
  EXPECT_EQ(o.options.get<MuonConfig>().options.ns_variant(), "hybrid");
  EXPECT_EQ(o.options.get<MuonConfig>().options.adjust_lr_fn(), AdjustLrFn::kMatchRmsAdamw);
  EXPECT_EQ(o.options.get<MuonConfig>().options.momentum_style(), MomentumStyle::kEmaAdd);
  EXPECT_EQ(o.options.get<MuonConfig>().options.matched_adamw_rms(), 0.18);
  EXPECT_EQ(o.routing, "toml");
  EXPECT_FALSE(o.fp32_main_params);
  EXPECT_EQ(t.config.dialect, "toml");
  EXPECT_EQ(t.config.mix_precision.param_dtype, "bfloat16");
  EXPECT_EQ(t.config.mix_precision.reduce_dtype.value_or(""), "float32");

  const Provenance& p = t.provenance;
  EXPECT_EQ(p.source("optimizer.adamw_config.adamw_lr"), ValueSource::kFile);
  EXPECT_EQ(p.user_key("optimizer.adamw_config.adamw_lr"), "optimizer.lr");
  EXPECT_EQ(p.source("optimizer.muon_config.muon_lr"), ValueSource::kDerived);
  EXPECT_EQ(p.source("optimizer.muon_config.muon_weight_decay"), ValueSource::kDerived);
  EXPECT_EQ(p.source("optimizer.muon_config.muon_ns_epsilon"), ValueSource::kDerived);
  EXPECT_EQ(p.source("optimizer.adamw_config.adamw_betas"), ValueSource::kDerived);
  EXPECT_EQ(p.source("optimizer.muon_config.muon_ns_variant"), ValueSource::kDerived);
  EXPECT_EQ(p.source("optimizer.muon_config.muon_momentum_style"), ValueSource::kDerived);
  EXPECT_EQ(p.source("optimizer.muon_config.muon_matched_adamw_rms"), ValueSource::kDerived);
  EXPECT_EQ(p.source("optimizer.routing"), ValueSource::kDerived);
  EXPECT_EQ(p.source("optimizer.adamw_config.adamw_eps"), ValueSource::kDefault);
}

TEST(TomlFrontEndTest, Example2OriginalUsesMuonLr) {
  const Translated t = translate_text(testing::kMuonExample2Toml);
  const OptimizerConfig& o = t.config.optimizer;
  EXPECT_EQ(o.options.get<torch::optim::AdamWOptions>().lr(), 3e-4);
  EXPECT_EQ(o.options.get<MuonConfig>().options.lr(), 3e-3);
  EXPECT_EQ(o.options.get<MuonConfig>().options.adjust_lr_fn(), AdjustLrFn::kOriginal);
  EXPECT_EQ(o.options.get<MuonConfig>().options.ns_variant(), "legacy");  // muon_hybrid_ns absent
  EXPECT_EQ(o.options.get<MuonConfig>().options.weight_decay(), 0.01);
  EXPECT_EQ(t.provenance.source("optimizer.muon_config.muon_lr"), ValueSource::kFile);
  EXPECT_EQ(t.provenance.user_key("optimizer.muon_config.muon_lr"), "optimizer.muon_lr");
}

TEST(TomlFrontEndTest, OriginalWithoutMuonLrFallsBackToLr) {
  const Translated t =
      translate_text("[optimizer]\nname = \"Muon\"\nlr = 5e-4\nmuon_adjust_lr_fn = \"original\"\n");
  EXPECT_EQ(muon_config(t.config).options.lr(), 5e-4);
  EXPECT_EQ(t.provenance.source("optimizer.muon_config.muon_lr"), ValueSource::kDerived);
}

TEST(TomlFrontEndTest, MatchRmsIgnoresMuonLrWithAWarning) {
  const int warnings_before = warning_count();
  const Translated t = translate_text("[optimizer]\nname = \"Muon\"\nlr = 2e-4\nmuon_lr = 2e-3\n");
  EXPECT_EQ(warning_count(), warnings_before + 1);
  EXPECT_EQ(muon_config(t.config).options.lr(), 2e-4);
  EXPECT_NE(t.provenance.notes.at("optimizer.muon_config.muon_lr").find("muon_lr = 0.002 ignored"),
            std::string::npos);
}

// torchtitan's [activation_checkpoint]: mode renamed, selective_ac_option's layer count parsed
// from its string, "op" refused naming the key.
TEST(TomlFrontEndTest, ActivationCheckpointSection) {
  EXPECT_EQ(translate_text("").config.train.activation_checkpointing, "none");
  const Translated t = translate_text(
      "[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"3\"\n");
  EXPECT_EQ(t.config.train.activation_checkpointing, "selective");
  EXPECT_EQ(t.config.train.activation_checkpointing_every, 3);
  EXPECT_EQ(t.provenance.source("train.activation_checkpointing_every"), ValueSource::kFile);
  for (const char* bad : {"op", "0", "2x", ""}) {
    const std::string message =
        error_of(std::string("[activation_checkpoint]\nselective_ac_option = \"") + bad + "\"\n");
    EXPECT_NE(message.find("activation_checkpoint.selective_ac_option: must be a layer count"),
              std::string::npos)
        << message;
  }
}

TEST(TomlFrontEndTest, MuonCommunicationDtype) {
  EXPECT_EQ(muon_config(translate_text("").config).options.communication_dtype(), at::kBFloat16);
  const Translated t = translate_text("[optimizer]\nmuon_communication_dtype = \"float32\"\n");
  EXPECT_EQ(muon_config(t.config).options.communication_dtype(), at::kFloat);
  EXPECT_EQ(t.provenance.source("optimizer.muon_config.muon_communication_dtype"),
            ValueSource::kFile);
}

TEST(TomlFrontEndTest, MuonNorMuonAndCautiousWeightDecay) {
  const MuonOptions defaults = muon_config(translate_text("").config).options;
  EXPECT_FALSE(defaults.normuon());
  EXPECT_EQ(defaults.normuon_beta2(), 0.95);
  EXPECT_EQ(defaults.normuon_epsilon(), 1e-10);
  EXPECT_FALSE(defaults.cautious_weight_decay());
  const Translated t = translate_text(
      "[optimizer]\nmuon_normuon = true\nmuon_normuon_beta2 = 0.9\nmuon_normuon_epsilon = "
      "1e-8\nmuon_cautious_weight_decay = true\n");
  EXPECT_TRUE(muon_config(t.config).options.normuon());
  EXPECT_EQ(muon_config(t.config).options.normuon_beta2(), 0.9);
  EXPECT_EQ(muon_config(t.config).options.normuon_epsilon(), 1e-8);
  EXPECT_TRUE(muon_config(t.config).options.cautious_weight_decay());
  for (const char* key : {"muon_normuon", "muon_normuon_beta2", "muon_normuon_epsilon",
                          "muon_cautious_weight_decay"}) {
    EXPECT_EQ(t.provenance.source(std::string("optimizer.muon_config.") + key), ValueSource::kFile)
        << key;
  }
}

TEST(TomlFrontEndTest, MuonPerHeadAndTelemetry) {
  EXPECT_FALSE(muon_config(translate_text("").config).per_head);
  EXPECT_FALSE(muon_config(translate_text("").config).telemetry);
  const Translated t = translate_text("[optimizer]\nmuon_per_head = true\nmuon_telemetry = true\n");
  EXPECT_TRUE(muon_config(t.config).per_head);
  EXPECT_TRUE(muon_config(t.config).telemetry);
  EXPECT_EQ(t.provenance.source("optimizer.muon_config.muon_per_head"), ValueSource::kFile);
  EXPECT_EQ(t.provenance.source("optimizer.muon_telemetry"), ValueSource::kFile);
}

TEST(TomlFrontEndTest, MuonNsDtype) {
  EXPECT_EQ(muon_config(translate_text("").config).options.ns_dtype(), at::kBFloat16);
  const Translated t = translate_text("[optimizer]\nmuon_ns_dtype = \"float32\"\n");
  EXPECT_EQ(muon_config(t.config).options.ns_dtype(), at::kFloat);
  EXPECT_EQ(t.provenance.source("optimizer.muon_config.muon_ns_dtype"), ValueSource::kFile);
  EXPECT_EQ(t.provenance.user_key("optimizer.muon_config.muon_ns_dtype"),
            "optimizer.muon_ns_dtype");
  // The YAML spelling in a TOML file is answered with the TOML key.
  EXPECT_EQ(error_of("[optimizer.muon_config]\nmuon_ns_dtype = \"float32\"\n"),
            "optimizer.muon_config.muon_ns_dtype: unknown key (did you mean "
            "optimizer.muon_ns_dtype?)");
}

TEST(TomlFrontEndTest, Example3Swap) {
  const Translated t = translate_text(testing::kMuonExample3Toml);
  EXPECT_TRUE(t.config.optimizer.swap_optimizer);
  EXPECT_EQ(t.config.optimizer.swap_merge_buckets, 4);
}

TEST(TomlFrontEndTest, SwapDirAndBucketSize) {
  const Translated t = translate_text(
      "[optimizer]\nswap_optimizer = true\nswap_dir = \"/scratch/swap\"\nswap_bucket_mb = 16\n");
  EXPECT_EQ(t.config.optimizer.swap_dir, "/scratch/swap");
  EXPECT_EQ(t.config.optimizer.swap_bucket_mb, 16);
  EXPECT_EQ(t.provenance.source("optimizer.swap_dir"), ValueSource::kFile);
  EXPECT_EQ(t.provenance.source("optimizer.swap_bucket_mb"), ValueSource::kFile);
  EXPECT_EQ(t.provenance.spelled_as.at("optimizer.swap_bucket_mb"), "optimizer.swap_bucket_mb");
}

TEST(TomlFrontEndTest, DefaultsFollowTorchtitan) {
  const Translated t = translate_text("");
  const OptimizerConfig& o = t.config.optimizer;
  EXPECT_EQ(o.target, "AdamW");
  EXPECT_EQ(o.options.get<torch::optim::AdamWOptions>().lr(), 8e-4);
  EXPECT_EQ(o.options.get<torch::optim::AdamWOptions>().weight_decay(), 0.1);
  EXPECT_EQ(o.options.get<MuonConfig>().options.lr(), 8e-4);
  EXPECT_EQ(o.options.get<MuonConfig>().options.ns_steps(), 5);
  EXPECT_EQ(o.options.get<MuonConfig>().options.ns_variant(), "legacy");
  EXPECT_FALSE(o.swap_optimizer);
  EXPECT_EQ(o.swap_merge_buckets, 1);
  EXPECT_EQ(o.swap_dir, "");
  EXPECT_EQ(o.swap_bucket_mb, 64);
  // enable = false (torchtitan's default): the folder is still known, but nothing is saved.
  EXPECT_EQ(t.config.checkpoint.dir, "./outputs/checkpoint");
  EXPECT_EQ(t.config.checkpoint.interval, 0);
  EXPECT_EQ(t.config.checkpoint.keep_last, 10);
  EXPECT_FALSE(t.config.checkpoint.restore_optimizer);
  EXPECT_FALSE(t.config.model_init_dtype.has_value());
}

TEST(TomlFrontEndTest, TrainingParallelismCheckpointMetricsModel) {
  const Translated t = translate_text(
      "[job]\ndump_folder = \"/runs/a\"\ndescription = \"tiny\"\n"
      "[training]\nsteps = 30\nseed = 7\nmax_norm = 0.5\nlocal_batch_size = 4\nseq_len = 32\n"
      "dataset = \"tokens\"\ndataset_path = \"/d/x.bin\"\nmixed_precision_param = \"float32\"\n"
      "mixed_precision_reduce = \"float32\"\n"
      "[lr_scheduler]\nwarmup_steps = 3\ndecay_type = \"linear\"\nmin_lr_factor = 0.2\n"
      "[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 3\n"
      "expert_parallel_degree = 2\n"
      "[checkpoint]\nenable = true\nfolder = \"ck\"\ninterval = 5\nkeep_latest_k = 2\n"
      "async_mode = \"async\"\ninitial_load_path = \"/old/step-00000010\"\n"
      "initial_load_model_only = false\n"
      "[metrics]\nlog_freq = 3\n[model]\nnum_layers = 3\nrope_theta = 5e5\n"
      "[comm]\ntrain_timeout_seconds = 7.5\n"
      "[validation]\nfreq = 4\ndataset_path = \"/d/val\"\nsteps = 3\n");
  const TrainerConfig& c = t.config;
  EXPECT_EQ(c.train.eval_every, 4);
  EXPECT_EQ(c.data.eval_path, "/d/val");
  EXPECT_EQ(c.data.eval_batches, 3);
  EXPECT_EQ(c.distributed.timeout_s, 7.5);
  EXPECT_EQ(t.provenance.source("distributed.timeout_s"), ValueSource::kFile);
  EXPECT_EQ(c.train.steps, 30);
  EXPECT_EQ(c.train.seed, 7);
  EXPECT_EQ(c.train.max_grad_norm, 0.5);
  EXPECT_EQ(c.data.micro_batch_size, 4);
  EXPECT_EQ(c.data.global_batch_size, 4 * 2 * 3);  // -1 (absent): local x replicate x shard
  EXPECT_EQ(t.provenance.source("data.global_batch_size"), ValueSource::kDerived);
  EXPECT_EQ(c.data.seq_len, 32);
  EXPECT_EQ(c.data.kind, "tokens");
  EXPECT_EQ(c.data.path, "/d/x.bin");
  EXPECT_EQ(c.mix_precision.param_dtype, "float32");
  EXPECT_EQ(c.train.lr_scheduler.warmup_steps, 3);
  EXPECT_EQ(c.train.lr_scheduler.decay, "linear");
  EXPECT_EQ(c.train.lr_scheduler.min_lr_ratio, 0.2);
  EXPECT_EQ(c.parallel.dp_replicate, 2);
  EXPECT_EQ(c.parallel.dp_shard, 3);
  EXPECT_EQ(c.parallel.ep, 2);
  EXPECT_EQ(c.checkpoint.dir, "/runs/a/ck");
  EXPECT_EQ(c.checkpoint.interval, 5);
  EXPECT_EQ(c.checkpoint.keep_last, 2);
  EXPECT_TRUE(c.checkpoint.async);
  EXPECT_EQ(c.checkpoint.restore_from, "/old/step-00000010");
  EXPECT_TRUE(c.checkpoint.restore_optimizer);
  EXPECT_EQ(c.train.log_every, 3);
  EXPECT_EQ(c.model.num_layers, 3);
  EXPECT_EQ(c.model.rope_theta, 5e5);
}

TEST(TomlFrontEndTest, ExplicitGlobalBatchAndBetas) {
  const Translated t = translate_text(
      "[training]\nlocal_batch_size = 2\nglobal_batch_size = 8\n[optimizer]\nbeta2 = 0.99\n");
  EXPECT_EQ(t.config.data.global_batch_size, 8);
  EXPECT_EQ(t.provenance.source("data.global_batch_size"), ValueSource::kFile);
  EXPECT_EQ(std::get<0>(adamw_config(t.config).betas()), 0.9);
  EXPECT_EQ(std::get<1>(adamw_config(t.config).betas()), 0.99);
  EXPECT_EQ(t.provenance.source("optimizer.adamw_config.adamw_betas"), ValueSource::kFile);
}

TEST(TomlFrontEndTest, UnknownKeysAndSections) {
  EXPECT_EQ(error_of("[optimizer]\nmuon_lrr = 1e-3\n"),
            "optimizer.muon_lrr: unknown key (did you mean optimizer.muon_lr?)");
  EXPECT_EQ(error_of("[optimiser]\nname = \"Muon\"\n"),
            "optimiser.name: unknown key (did you mean optimizer.name?)");
  EXPECT_EQ(error_of("[training]\nstep = 3\n"),
            "training.step: unknown key (did you mean training.steps?)");
  // A YAML key in a TOML file is answered with its TOML spelling.
  EXPECT_EQ(error_of("[train]\nsteps = 3\n"),
            "train.steps: unknown key (did you mean training.steps?)");
  EXPECT_EQ(error_of("optimizer = 3\n"), "optimizer: expected a table [optimizer], got integer 3");
}

TEST(TomlFrontEndTest, MuonNsVariantNamesAnySchedule) {
  const Translated t = translate_text(
      "[optimizer]\nname = \"Muon\"\nmuon_ns_variant = \"polar_express\"\nmuon_ns_steps = 8\n");
  EXPECT_EQ(muon_config(t.config).options.ns_variant(), "polar_express");
  EXPECT_EQ(muon_config(t.config).options.ns_steps(), 8);
  EXPECT_EQ(t.provenance.source("optimizer.muon_config.muon_ns_variant"), ValueSource::kFile);
  EXPECT_EQ(t.provenance.user_key("optimizer.muon_config.muon_ns_variant"),
            "optimizer.muon_ns_variant");
  EXPECT_EQ(toml_key_for("optimizer.muon_config.muon_ns_variant"), "optimizer.muon_ns_variant");
  // muon_hybrid_ns = true would also choose the schedule: both together are ambiguous.
  EXPECT_EQ(error_of("[optimizer]\nmuon_ns_variant = \"quintic\"\nmuon_hybrid_ns = false\n"),
            "optimizer.muon_ns_variant: set either optimizer.muon_ns_variant or "
            "optimizer.muon_hybrid_ns, not both (muon_hybrid_ns = true is muon_ns_variant = "
            "\"hybrid\")");
  EXPECT_EQ(error_of("[optimizer]\nmuon_ns_variant = 5\n"),
            "optimizer.muon_ns_variant: expected a string, got integer 5");
}

TEST(TomlFrontEndTest, WrongTypesNameTheTomlKey) {
  EXPECT_EQ(error_of("[optimizer]\nlr = \"fast\"\n"),
            "optimizer.lr: expected a number, got string 'fast'");
  EXPECT_EQ(error_of("[optimizer]\nmuon_ns_steps = 2.5\n"),
            "optimizer.muon_ns_steps: expected an integer, got number 2.5");
  EXPECT_EQ(error_of("[optimizer]\nmuon_hybrid_ns = \"yes\"\n"),
            "optimizer.muon_hybrid_ns: expected true or false, got string 'yes'");
  EXPECT_EQ(error_of("[job]\ncustom_config_module = 1\n"),
            "job.custom_config_module: expected a string, got integer 1");
  EXPECT_EQ(error_of("[checkpoint]\nasync_mode = \"sometimes\"\n"),
            "checkpoint.async_mode: must be one of disabled, async, async_with_pinned_mem, got "
            "'sometimes'");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
