#include "mixtrain/config/yaml_reader.h"

#include <gtest/gtest.h>

#include <cmath>

#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::config_error_of;
using testing::TempDir;
using Kind = DocValue::Kind;

const Where kYamlWhere{"--set", "k"};

TEST(YamlReaderTest, PlainScalarsAreTypedByTheCoreSchema) {
  EXPECT_EQ(parse_yaml_value("3", kYamlWhere).kind, Kind::kInt);
  EXPECT_EQ(parse_yaml_value("-12", kYamlWhere).int_value, -12);
  EXPECT_EQ(parse_yaml_value("1e-3", kYamlWhere).kind, Kind::kFloat);
  EXPECT_EQ(parse_yaml_value("1e-3", kYamlWhere).float_value, 0.001);
  EXPECT_EQ(parse_yaml_value("2.2e-4", kYamlWhere).float_value, 2.2e-4);
  EXPECT_EQ(parse_yaml_value(".5", kYamlWhere).float_value, 0.5);
  EXPECT_TRUE(std::isinf(parse_yaml_value(".inf", kYamlWhere).float_value));
  EXPECT_EQ(parse_yaml_value("true", kYamlWhere).kind, Kind::kBool);
  EXPECT_FALSE(parse_yaml_value("False", kYamlWhere).bool_value);
  EXPECT_EQ(parse_yaml_value("null", kYamlWhere).kind, Kind::kNull);
  EXPECT_EQ(parse_yaml_value("~", kYamlWhere).kind, Kind::kNull);
  EXPECT_EQ(parse_yaml_value("", kYamlWhere).kind, Kind::kNull);
  EXPECT_EQ(parse_yaml_value("bfloat16", kYamlWhere).string_value, "bfloat16");
  // yes/no are strings in YAML 1.2, not booleans.
  EXPECT_EQ(parse_yaml_value("yes", kYamlWhere).kind, Kind::kString);
}

TEST(YamlReaderTest, QuotedScalarsStayStrings) {
  const DocValue v = parse_yaml_value("'3'", kYamlWhere);
  EXPECT_EQ(v.kind, Kind::kString);
  EXPECT_EQ(v.string_value, "3");
  EXPECT_EQ(parse_yaml_value("\"true\"", kYamlWhere).kind, Kind::kString);
}

TEST(YamlReaderTest, FlowListsAndNestedLists) {
  const DocValue v = parse_yaml_value("[0.9,0.95]", kYamlWhere);
  ASSERT_EQ(v.kind, Kind::kList);
  ASSERT_EQ(v.items.size(), 2u);
  EXPECT_EQ(v.items[1].float_value, 0.95);
  const DocValue nested = parse_yaml_value("[[3.4445, -4.775, 2.0315]]", kYamlWhere);
  ASSERT_EQ(nested.items.size(), 1u);
  EXPECT_EQ(nested.items[0].items[1].float_value, -4.775);
}

TEST(YamlReaderTest, FileKeepsKeyOrderAndSections) {
  TempDir dir;
  const std::string path = dir.write("c.yaml", "b: 1\na:\n  x: [1, 2]\n  y: null\n");
  const DocValue root = read_yaml_file(path);
  ASSERT_TRUE(root.is_map());
  ASSERT_EQ(root.entries.size(), 2u);
  EXPECT_EQ(root.entries[0].first, "b");
  EXPECT_EQ(root.find("a")->find("x")->items.size(), 2u);
  EXPECT_EQ(root.find("a")->find("y")->kind, Kind::kNull);
}

TEST(YamlReaderTest, EmptyFileIsAnEmptyMapping) {
  TempDir dir;
  const DocValue root = read_yaml_file(dir.write("empty.yaml", "# nothing\n"));
  EXPECT_TRUE(root.is_map());
  EXPECT_TRUE(root.entries.empty());
}

TEST(YamlReaderTest, ErrorsNameTheFile) {
  TempDir dir;
  const std::string missing = dir.path() + "/missing.yaml";
  EXPECT_EQ(config_error_of([&] { read_yaml_file(missing); }),
            missing + ": cannot open the config file (missing or unreadable)");

  const std::string bad = dir.write("bad.yaml", "optimizer:\n  a: 1\n b: [1, 2\n");
  const std::string message = config_error_of([&] { read_yaml_file(bad); });
  EXPECT_EQ(message.rfind(bad + ": line ", 0), 0u) << message;
  EXPECT_NE(message.find("YAML syntax error"), std::string::npos);

  const std::string list = dir.write("list.yaml", "- 1\n- 2\n");
  EXPECT_NE(config_error_of([&] { read_yaml_file(list); }).find("top level must be a mapping"),
            std::string::npos);

  const std::string duplicate = dir.write("dup.yaml", "train:\n  steps: 1\n  steps: 2\n");
  EXPECT_EQ(config_error_of([&] { read_yaml_file(duplicate); }),
            duplicate + ": train.steps: duplicate key (line 3)");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
