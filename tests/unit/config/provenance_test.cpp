#include "mixtrain/config/provenance.h"

#include <gtest/gtest.h>

#include <string>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(ProvenanceTest, SourceNames) {
  EXPECT_STREQ(value_source_name(ValueSource::kDefault), "default");
  EXPECT_STREQ(value_source_name(ValueSource::kFile), "file");
  EXPECT_STREQ(value_source_name(ValueSource::kOverride), "--set");
  EXPECT_STREQ(value_source_name(ValueSource::kDerived), "derived");
}

TEST(ProvenanceTest, OriginAndUserKey) {
  Provenance p;
  p.file = "c.toml";
  p.sources["optimizer.adamw_config.adamw_lr"] = ValueSource::kOverride;
  p.sources["train.steps"] = ValueSource::kFile;
  p.spelled_as["train.steps"] = "training.steps";
  EXPECT_EQ(p.source("model.vocab_size"), ValueSource::kDefault);
  EXPECT_EQ(p.origin_of("optimizer.adamw_config.adamw_lr"), "--set");
  EXPECT_EQ(p.origin_of("train.steps"), "c.toml");
  EXPECT_EQ(p.origin_of("model.vocab_size"), "c.toml");
  EXPECT_EQ(p.user_key("train.steps"), "training.steps");
  EXPECT_EQ(p.user_key("model.vocab_size"), "model.vocab_size");
}

// A keyed error from a build step (core/error.h) is rendered with the key as the user wrote it
// and where it came from; the file has no line numbers to give, so none are invented.
TEST(ProvenanceTest, FormatUserErrorSpellsTheKeyAsWritten) {
  Provenance p;
  p.file = "run.toml";
  p.sources["data.path"] = ValueSource::kFile;
  p.spelled_as["data.path"] = "training.dataset_path";
  p.sources["parallel.dp_shard"] = ValueSource::kOverride;
  p.spelled_as["parallel.dp_shard"] = "parallelism.data_parallel_shard_degree";

  const DataError missing(ConfigKey{"data.path"},
                          "token files 'x*.bin': the pattern matches no file");
  EXPECT_EQ(std::string(missing.what()),
            "data.path: token files 'x*.bin': the pattern matches no file");  // canonical
  EXPECT_EQ(format_user_error(missing, p),
            "run.toml: training.dataset_path: token files 'x*.bin': the pattern matches no file");
  EXPECT_EQ(format_user_error(ConfigError(ConfigKey{"parallel.dp_shard"}, "2 x 1 = 2 ranks"), p),
            "--set: parallelism.data_parallel_shard_degree: 2 x 1 = 2 ranks");
  // A key the dialect spells canonically, and a complete message without a key.
  EXPECT_EQ(format_user_error(ConfigError(ConfigKey{"model.name"}, "unknown model 'x'"), p),
            "run.toml: model.name: unknown model 'x'");
  const ConfigError complete("run.toml: train.steps: must be > 0, got 0");
  EXPECT_TRUE(complete.key().empty());
  EXPECT_EQ(complete.problem(), complete.what());
  EXPECT_EQ(format_user_error(complete, p), "run.toml: train.steps: must be > 0, got 0");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
