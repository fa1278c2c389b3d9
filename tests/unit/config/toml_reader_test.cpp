#include "mixtrain/config/toml_reader.h"

#include <gtest/gtest.h>

#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::config_error_of;
using testing::TempDir;
using Kind = DocValue::Kind;

TEST(TomlReaderTest, TablesAndTypedValues) {
  TempDir dir;
  const std::string path =
      dir.write("c.toml",
                "[optimizer]\nname = \"Muon\"\nlr = 2.2e-4\nmuon_ns_steps = 10\n"
                "muon_hybrid_ns = true\n[model]\nlist = [1, 2]\n");
  const DocValue root = read_toml_file(path);
  const DocValue* optimizer = root.find("optimizer");
  ASSERT_NE(optimizer, nullptr);
  EXPECT_EQ(optimizer->find("name")->string_value, "Muon");
  EXPECT_EQ(optimizer->find("lr")->kind, Kind::kFloat);
  EXPECT_EQ(optimizer->find("lr")->float_value, 2.2e-4);
  EXPECT_EQ(optimizer->find("muon_ns_steps")->kind, Kind::kInt);
  EXPECT_EQ(optimizer->find("muon_ns_steps")->int_value, 10);
  EXPECT_TRUE(optimizer->find("muon_hybrid_ns")->bool_value);
  EXPECT_EQ(root.find("model")->find("list")->items.size(), 2u);
}

TEST(TomlReaderTest, SeedExampleWithChineseCommentsParses) {
  TempDir dir;
  const DocValue root = read_toml_file(dir.write("e1.toml", testing::kMuonExample1Toml));
  EXPECT_EQ(root.find("job")->find("custom_config_module")->string_value,
            "torchtitan_npu.config.custom_config");
  EXPECT_EQ(root.find("optimizer")->find("muon_adjust_lr_fn")->string_value, "match_rms_adamw");
}

TEST(TomlReaderTest, SyntaxErrorNamesFileAndLine) {
  TempDir dir;
  const std::string path = dir.write("bad.toml", "[optimizer]\nname = \"Muon\"\nlr = \n");
  const std::string message = config_error_of([&] { read_toml_file(path); });
  EXPECT_EQ(message.rfind(path + ": line 3: TOML syntax error", 0), 0u) << message;
}

TEST(TomlReaderTest, DuplicateKeyIsASyntaxError) {
  TempDir dir;
  const std::string path = dir.write("dup.toml", "[optimizer]\nlr = 1.0\nlr = 2.0\n");
  const std::string message = config_error_of([&] { read_toml_file(path); });
  EXPECT_EQ(message.rfind(path + ": line ", 0), 0u) << message;
}

TEST(TomlReaderTest, MissingFileAndDates) {
  TempDir dir;
  const std::string missing = dir.path() + "/none.toml";
  EXPECT_EQ(config_error_of([&] { read_toml_file(missing); }),
            missing + ": cannot open the config file (missing or unreadable)");
  const std::string dated = dir.write("d.toml", "[job]\ndescription = 1979-05-27\n");
  EXPECT_NE(config_error_of([&] { read_toml_file(dated); }).find("job.description: dates"),
            std::string::npos);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
