#include "mixtrain/config/schema.h"

#include <gtest/gtest.h>

#include <set>

#include "mixtrain/config/yaml_reader.h"
#include "mixtrain/optim/adamw_config.h"
#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::config_error_of;

TEST(SchemaTest, KeysAreUniqueAndCoverEveryField) {
  std::set<std::string> keys;
  for (const LeafSpec& spec : canonical_leaves()) {
    EXPECT_TRUE(keys.insert(spec.key).second) << "duplicate " << spec.key;
  }
  // Fields of trainer_config.h: dialect, source_file, model_init_dtype (3); model (43: the 24 every
  // decoder has, the 6 of model/moe_config.h, model.sliding_window, the 12 of
  // model/deepseek_v3_config.h);
  // data (7: kind, path, seq_len, micro/global batch, eval_path, eval_batches); train (11: device,
  // steps, seed, max_grad_norm, log_every, eval_every, profile, count_ops, cpu_allocator,
  // activation_checkpointing, activation_checkpointing_every) + lr_scheduler (3);
  // parallel (6: dp_shard, dp_replicate, ep, cp, tp, cp_rotate_method); distributed (1); checkpoint
  // (7); optimizer target, fp32_main_params, routing, swap_optimizer, swap_merge_buckets, swap_dir,
  // swap_bucket_mb, muon_telemetry (8); adamw (4); muon (20); sgd (5); mix_precision (4); fsdp (1).
  EXPECT_EQ(keys.size(), 3u + 43 + 7 + 11 + 3 + 6 + 1 + 7 + 8 + 4 + 20 + 5 + 4 + 1);
  for (const char* key : {"model_init_dtype",
                          "optimizer._target_",
                          "optimizer.fp32_main_params",
                          "optimizer.muon_config.muon_ns_coefficients",
                          "optimizer.adamw_config.adamw_betas",
                          "fsdp_config.mix_precision.reduce_dtype",
                          "train.lr_scheduler.min_lr_ratio",
                          "checkpoint.restore_optimizer",
                          "optimizer.swap_merge_buckets",
                          "distributed.timeout_s",
                          "optimizer.muon_config.muon_communication_dtype",
                          "optimizer.muon_config.muon_normuon",
                          "optimizer.muon_config.muon_normuon_beta2",
                          "optimizer.muon_config.muon_normuon_epsilon",
                          "optimizer.muon_config.muon_cautious_weight_decay",
                          "optimizer.muon_config.muon_per_head",
                          "optimizer.muon_telemetry",
                          "optimizer.muon_config.muon_qk_clip_tau",
                          "fsdp_config.reshard_after_forward",
                          "optimizer.swap_dir",
                          "optimizer.swap_bucket_mb",
                          "train.profile",
                          "train.eval_every",
                          "data.eval_path",
                          "data.eval_batches",
                          "model.hf_config",
                          "model.init_from"}) {
    EXPECT_NE(find_canonical_leaf(key), nullptr) << key;
  }
  EXPECT_EQ(find_canonical_leaf("optimizer.muon_config"), nullptr);
}

TEST(SchemaTest, DerivedLeavesAreNotSettable) {
  EXPECT_FALSE(find_canonical_leaf("dialect")->settable);
  EXPECT_FALSE(find_canonical_leaf("source_file")->settable);
  EXPECT_FALSE(find_canonical_leaf("optimizer.routing")->settable);
  EXPECT_TRUE(find_canonical_leaf("optimizer.adamw_config.adamw_lr")->settable);
}

TEST(SchemaTest, AssignConvertsAndFormatReadsBack) {
  TrainerConfig config;
  const Where where{"f.yaml", "k"};
  find_canonical_leaf("optimizer.adamw_config.adamw_betas")
      ->assign(config, parse_yaml_value("[0.8, 0.99]", where), where);
  EXPECT_EQ(std::get<0>(adamw_config(config).betas()), 0.8);
  EXPECT_EQ(std::get<1>(adamw_config(config).betas()), 0.99);
  EXPECT_EQ(find_canonical_leaf("optimizer.adamw_config.adamw_betas")->format(config),
            "[0.8, 0.99]");

  find_canonical_leaf("model_init_dtype")
      ->assign(config, parse_yaml_value("bfloat16", where), where);
  EXPECT_EQ(config.model_init_dtype.value_or(""), "bfloat16");
  find_canonical_leaf("model_init_dtype")->assign(config, parse_yaml_value("null", where), where);
  EXPECT_FALSE(config.model_init_dtype.has_value());
  EXPECT_EQ(find_canonical_leaf("model_init_dtype")->format(config), "null");

  EXPECT_EQ(
      config_error_of([&] {
        find_canonical_leaf("train.steps")->assign(config, parse_yaml_value("ten", where), where);
      }),
      "f.yaml: k: expected an integer, got string 'ten'");
}

TEST(SchemaTest, DefaultsFormat) {
  const TrainerConfig defaults;
  EXPECT_EQ(find_canonical_leaf("optimizer.muon_config.muon_ns_epsilon")->format(defaults),
            "1e-07");
  EXPECT_EQ(find_canonical_leaf("optimizer.muon_config.muon_nesterov")->format(defaults), "true");
  EXPECT_EQ(find_canonical_leaf("fsdp_config.mix_precision.reduce_dtype")->format(defaults),
            "null");
  EXPECT_EQ(find_canonical_leaf("checkpoint.dir")->format(defaults), "\"\"");
  EXPECT_EQ(find_canonical_leaf("optimizer.muon_config.muon_ns_coefficients")->format(defaults),
            "[]");
}

TEST(SchemaTest, NumbersFormatShortestRoundTrip) {
  EXPECT_EQ(format_number(0.001), "0.001");
  EXPECT_EQ(format_number(2.2e-4), "0.00022");
  EXPECT_EQ(format_number(1e-8), "1e-08");
  EXPECT_EQ(format_number(0.95), "0.95");
  EXPECT_EQ(format_number(10000.0), "10000");
  EXPECT_EQ(format_number(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(format_triples({{3.4445, -4.775, 2.0315}}), "[[3.4445, -4.775, 2.0315]]");
  EXPECT_EQ(format_string_list({"router", "gate"}), "[router, gate]");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
