#include "mixtrain/config/provenance.h"

#include <gtest/gtest.h>

namespace mixtrain {
namespace {

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

}  // namespace
}  // namespace mixtrain
