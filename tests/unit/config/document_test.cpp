#include "mixtrain/config/document.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::config_error_of;

DocValue int_value(int64_t i) {
  DocValue v;
  v.kind = DocValue::Kind::kInt;
  v.int_value = i;
  return v;
}
DocValue float_value(double f) {
  DocValue v;
  v.kind = DocValue::Kind::kFloat;
  v.float_value = f;
  return v;
}
DocValue string_value(const std::string& s) {
  DocValue v;
  v.kind = DocValue::Kind::kString;
  v.string_value = s;
  return v;
}
DocValue list_of(std::vector<DocValue> items) {
  DocValue v;
  v.kind = DocValue::Kind::kList;
  v.items = std::move(items);
  return v;
}

const Where kWhere{"f.yaml", "a.b"};

TEST(DocumentTest, IntegersAcceptWholeFloatsButNotFractions) {
  EXPECT_EQ(read_int(int_value(7), kWhere), 7);
  EXPECT_EQ(read_int(float_value(1e3), kWhere), 1000);
  EXPECT_EQ(config_error_of([] { read_int(float_value(2.5), kWhere); }),
            "f.yaml: a.b: expected an integer, got number 2.5");
  EXPECT_EQ(config_error_of([] { read_int(string_value("8"), kWhere); }),
            "f.yaml: a.b: expected an integer, got string '8'");
}

TEST(DocumentTest, FloatsAcceptIntegersAndRejectNonFinite) {
  EXPECT_EQ(read_float(int_value(3), kWhere), 3.0);
  EXPECT_EQ(read_float(float_value(0.25), kWhere), 0.25);
  EXPECT_NE(config_error_of([] {
              read_float(float_value(std::numeric_limits<double>::infinity()), kWhere);
            }).find("expected a finite number"),
            std::string::npos);
  EXPECT_EQ(config_error_of([] { read_float(string_value("abc"), kWhere); }),
            "f.yaml: a.b: expected a number, got string 'abc'");
}

TEST(DocumentTest, BoolsAndStringsAreStrict) {
  DocValue yes;
  yes.kind = DocValue::Kind::kBool;
  yes.bool_value = true;
  EXPECT_TRUE(read_bool(yes, kWhere));
  EXPECT_EQ(config_error_of([] { read_bool(int_value(1), kWhere); }),
            "f.yaml: a.b: expected true or false, got integer 1");
  EXPECT_EQ(read_string(string_value("x"), kWhere), "x");
  EXPECT_EQ(config_error_of([] { read_string(int_value(5), kWhere); }),
            "f.yaml: a.b: expected a string, got integer 5");
}

TEST(DocumentTest, ListShapesAreChecked) {
  const auto pair = read_float_pair(list_of({float_value(0.9), float_value(0.95)}), kWhere);
  EXPECT_EQ(pair[0], 0.9);
  EXPECT_EQ(pair[1], 0.95);
  EXPECT_EQ(
      config_error_of([] {
        read_float_pair(list_of({float_value(0.9), float_value(0.95), float_value(1)}), kWhere);
      }),
      "f.yaml: a.b: expected a list of 2 numbers, got a list of 3 items");

  const auto triples = read_float_triples(
      list_of({list_of({int_value(3), float_value(-4.5), int_value(2)})}), kWhere);
  ASSERT_EQ(triples.size(), 1u);
  EXPECT_EQ(triples[0][1], -4.5);
  EXPECT_NE(config_error_of([] {
              read_float_triples(list_of({list_of({int_value(3), int_value(2)})}), kWhere);
            }).find("item 0 to be a list of 3 numbers"),
            std::string::npos);
  EXPECT_TRUE(read_float_triples(DocValue(), kWhere).empty());

  const auto names = read_string_list(list_of({string_value("router")}), kWhere);
  EXPECT_EQ(names, std::vector<std::string>{"router"});
}

TEST(DocumentTest, SplitOverrideNeedsKeyEqualsValue) {
  const Override o = split_override("train.steps=30");
  EXPECT_EQ(o.key, "train.steps");
  EXPECT_EQ(o.raw_value, "30");
  EXPECT_EQ(split_override("data.path=a=b").raw_value, "a=b");
  EXPECT_EQ(split_override("data.path=").raw_value, "");
  EXPECT_NE(config_error_of([] { split_override("train.steps"); }).find("expected key=value"),
            std::string::npos);
  EXPECT_NE(config_error_of([] { split_override("=3"); }).find("--set"), std::string::npos);
}

TEST(DocumentTest, SetDottedCreatesSectionsAndReplacesLeaves) {
  DocValue root = DocValue::map();
  set_dotted(root, "optimizer.adamw_config.adamw_lr", float_value(0.5), "f.yaml");
  set_dotted(root, "optimizer.adamw_config.adamw_lr", float_value(0.25), "f.yaml");
  const DocValue* lr = root.find("optimizer")->find("adamw_config")->find("adamw_lr");
  ASSERT_NE(lr, nullptr);
  EXPECT_EQ(lr->float_value, 0.25);
  EXPECT_EQ(root.find("optimizer")->find("adamw_config")->entries.size(), 1u);

  DocValue scalar_section = DocValue::map();
  scalar_section.entries.emplace_back("optimizer", int_value(5));
  EXPECT_EQ(config_error_of([&] {
              set_dotted(scalar_section, "optimizer.swap_optimizer", int_value(1), "f.yaml");
            }),
            "f.yaml: optimizer: expected a mapping, got integer 5");
}

TEST(DocumentTest, ClosestKeyByEditDistance) {
  const std::vector<std::string> keys = {"optimizer.muon_config.muon_lr",
                                         "optimizer.muon_config.muon_momentum", "train.steps"};
  EXPECT_EQ(closest_key("optimizer.muon_config.muon_lrr", keys), "optimizer.muon_config.muon_lr");
  EXPECT_EQ(closest_key("trian.steps", keys), "train.steps");  // transposition costs 1
  EXPECT_EQ(closest_key("x", {}), "");
}

TEST(DocumentTest, UnknownKeyNamesFullKeyAndSuggestion) {
  const std::vector<std::string> keys = {"optimizer.fp32_main_params", "train.steps"};
  DocValue section = DocValue::map();
  DocValue yes;
  yes.kind = DocValue::Kind::kBool;
  section.entries.emplace_back("fp32_main_params", yes);
  EXPECT_EQ(config_error_of([&] { throw_unknown_key("f.yaml", "optimzer", section, keys); }),
            "f.yaml: optimzer.fp32_main_params: unknown key (did you mean "
            "optimizer.fp32_main_params?)");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
