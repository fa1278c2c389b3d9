#include "mixtrain/config/yaml_front_end.h"

#include <gtest/gtest.h>

#include "mixtrain/config/yaml_reader.h"
#include "mixtrain/optim/adamw_config.h"
#include "mixtrain/optim/muon_config.h"
#include "unit/config/temp_config.h"
#include "unit/config/translated.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::Translated;

void yaml_front_end(const std::string& path, TrainerConfig& config, Provenance& provenance) {
  translate_yaml(read_yaml_file(path), config, provenance);
}

Translated translate_yaml_text(const std::string& text) {
  Translated t = testing::translate_file("c.yaml", text, yaml_front_end);
  t.provenance.file = "c.yaml";  // the temp dir is gone; keep messages readable
  return t;
}

std::string yaml_error_of(const std::string& text) {
  return testing::front_end_error("c.yaml", text, yaml_front_end);
}

TEST(YamlFrontEndTest, RfcSection1Verbatim) {
  const Translated t = translate_yaml_text(testing::kRfcSection1Yaml);
  const TrainerConfig& c = t.config;
  EXPECT_EQ(c.model_init_dtype.value_or(""), "bfloat16");
  EXPECT_EQ(c.optimizer.target, "Muon");  // normalised from the dotted class path
  EXPECT_TRUE(c.optimizer.fp32_main_params);
  EXPECT_EQ(muon_config(c).options.lr(), 0.02);
  EXPECT_EQ(muon_config(c).options.weight_decay(), 0.0);
  EXPECT_EQ(muon_config(c).options.momentum(), 0.95);
  EXPECT_TRUE(muon_config(c).options.nesterov());
  EXPECT_EQ(muon_config(c).options.ns_steps(), 5);
  EXPECT_EQ(muon_config(c).options.ns_variant(), "asym5");
  EXPECT_EQ(adamw_config(c).lr(), 0.001);
  EXPECT_EQ(adamw_config(c).weight_decay(), 0.01);
  EXPECT_EQ(c.mix_precision.param_dtype, "bfloat16");
  EXPECT_EQ(c.mix_precision.reduce_dtype.value_or(""), "float32");
  EXPECT_EQ(c.mix_precision.output_dtype, "bfloat16");
  EXPECT_TRUE(c.mix_precision.cast_forward_inputs);
  EXPECT_EQ(c.dialect, "yaml");
  EXPECT_EQ(c.optimizer.routing, "yaml");

  EXPECT_EQ(t.provenance.source("optimizer.muon_config.muon_lr"), ValueSource::kFile);
  EXPECT_EQ(t.provenance.source("optimizer.adamw_config.adamw_eps"), ValueSource::kDefault);
  EXPECT_EQ(t.provenance.source("optimizer.routing"), ValueSource::kDerived);
}

TEST(YamlFrontEndTest, TargetSpellings) {
  EXPECT_EQ(translate_yaml_text("optimizer:\n  _target_: AdamW\n").config.optimizer.target,
            "AdamW");
  EXPECT_EQ(translate_yaml_text("optimizer:\n  _target_: Muon\n").config.optimizer.target, "Muon");
  EXPECT_EQ(
      translate_yaml_text("optimizer:\n  _target_: hyper_parallel.auto_models.components.optim."
                          "optimizer.optimizer.AdamW\n")
          .config.optimizer.target,
      "AdamW");
}

TEST(YamlFrontEndTest, AllOurSectionsAndListKeys) {
  const Translated t = translate_yaml_text(
      "model:\n  num_layers: 3\ndata:\n  kind: tokens\n  path: /d/*.bin\n"
      "train:\n  lr_scheduler:\n    decay: linear\nparallel:\n  ep: 2\n"
      "checkpoint:\n  dir: ck\n  async: true\n"
      "optimizer:\n  swap_optimizer: true\n  swap_merge_buckets: 4\n  adamw_config:\n"
      "    adamw_betas: [0.9, 0.95]\n  muon_config:\n    muon_ns_variant: custom\n"
      "    muon_ns_steps: 2\n    muon_ns_coefficients: [[3, -4, 2], [2, -1.5, 0.5]]\n"
      "    muon_adamw_keywords: [router]\n");
  const TrainerConfig& c = t.config;
  EXPECT_EQ(c.model.num_layers, 3);
  EXPECT_EQ(c.data.kind, "tokens");
  EXPECT_EQ(c.data.path, "/d/*.bin");
  EXPECT_EQ(c.train.lr_scheduler.decay, "linear");
  EXPECT_EQ(c.parallel.ep, 2);
  EXPECT_EQ(c.checkpoint.dir, "ck");
  EXPECT_TRUE(c.checkpoint.async);
  EXPECT_TRUE(c.optimizer.swap_optimizer);
  EXPECT_EQ(c.optimizer.swap_merge_buckets, 4);
  EXPECT_EQ(std::get<1>(adamw_config(c).betas()), 0.95);
  ASSERT_EQ(muon_config(c).options.ns_coefficients().size(), 2u);
  EXPECT_EQ(muon_config(c).options.ns_coefficients()[1][1], -1.5);
  EXPECT_EQ(muon_config(c).adamw_keywords, std::vector<std::string>{"router"});
}

TEST(YamlFrontEndTest, EmptySectionsAreAllowed) {
  const Translated t = translate_yaml_text("optimizer:\nmodel:\n");
  EXPECT_EQ(t.config.optimizer.target, "AdamW");
}

TEST(YamlFrontEndTest, UnknownKeysNameTheClosestKey) {
  EXPECT_EQ(yaml_error_of("optimizer:\n  muon_config:\n    muon_lrr: 0.02\n"),
            "optimizer.muon_config.muon_lrr: unknown key (did you mean "
            "optimizer.muon_config.muon_lr?)");
  EXPECT_EQ(yaml_error_of("optimizer:\n  fp32_main_param: true\n"),
            "optimizer.fp32_main_param: unknown key (did you mean optimizer.fp32_main_params?)");
  EXPECT_EQ(yaml_error_of("fsdp_config:\n  mixed_precision:\n    reduce_dtype: float32\n"),
            "fsdp_config.mixed_precision.reduce_dtype: unknown key (did you mean "
            "fsdp_config.mix_precision.reduce_dtype?)");
  // A TOML key in a YAML file is answered with its canonical spelling.
  EXPECT_EQ(yaml_error_of("training:\n  local_batch_size: 4\n"),
            "training.local_batch_size: unknown key (did you mean data.micro_batch_size?)");
  // Derived leaves are not keys a file may set.
  EXPECT_EQ(
      yaml_error_of("optimizer:\n  routing: toml\n").rfind("optimizer.routing: unknown key", 0),
      0u);
}

TEST(YamlFrontEndTest, WrongTypes) {
  EXPECT_EQ(yaml_error_of("train:\n  steps: ten\n"),
            "train.steps: expected an integer, got string 'ten'");
  EXPECT_EQ(yaml_error_of("train:\n  steps: 2.5\n"),
            "train.steps: expected an integer, got number 2.5");
  EXPECT_EQ(yaml_error_of("optimizer:\n  fp32_main_params: 1\n"),
            "optimizer.fp32_main_params: expected true or false, got integer 1");
  EXPECT_EQ(yaml_error_of("optimizer:\n  adamw_config:\n    adamw_betas: [0.9, 0.95, 0.99]\n"),
            "optimizer.adamw_config.adamw_betas: expected a list of 2 numbers, got a list of 3 "
            "items");
  EXPECT_EQ(yaml_error_of("optimizer:\n  adamw_config:\n    adamw_lr: '1e-3'\n"),
            "optimizer.adamw_config.adamw_lr: expected a number, got string '1e-3'");
  EXPECT_EQ(yaml_error_of("optimizer: 3\n"),
            "optimizer: expected a mapping of keys, got integer 3");
  EXPECT_EQ(yaml_error_of("model:\n  vocab_size:\n    x: 1\n"),
            "model.vocab_size: expected an integer, got a mapping");
}

TEST(YamlFrontEndTest, OverriddenLeavesAreMarked) {
  DocValue document = DocValue::map();
  DocValue steps = parse_yaml_value("30", {"--set", "train.steps"});
  steps.from_override = true;
  set_dotted(document, "train.steps", steps, "c.yaml");
  TrainerConfig config;
  Provenance provenance;
  provenance.file = "c.yaml";
  translate_yaml(document, config, provenance);
  EXPECT_EQ(config.train.steps, 30);
  EXPECT_EQ(provenance.source("train.steps"), ValueSource::kOverride);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
