// Option fields (option_fields.h): each codec reads a config value, shows it as the config
// does, and round-trips through a checkpoint's JSON; a choice refuses unknown names with the
// list; rules name the value; fields_problem / fields_to_json / fields_from_json cover a list.
#include "mixtrain/optim/option_fields.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

enum class Shape { kRound, kSquare };

struct Options {
  double rate = 0.5;
  int64_t steps = 3;
  bool on = false;
  std::string label = "";
  std::tuple<double, double> pair = {0.9, 0.999};
  std::vector<std::array<double, 3>> triples;
  Shape shape = Shape::kRound;
};

std::vector<OptionField<Options>> fields() {
  return {option<Options>(
              "rate", [](auto& o) -> auto& { return o.rate; }, NumberCodec{}, rule_positive),
          option<Options>(
              "steps", [](auto& o) -> auto& { return o.steps; }, IntegerCodec{}),
          option<Options>(
              "on", [](auto& o) -> auto& { return o.on; }, FlagCodec{}),
          option<Options>(
              "label", [](auto& o) -> auto& { return o.label; }, TextCodec{},
              rule_one_of({"", "a", "b"})),
          option<Options>(
              "pair", [](auto& o) -> auto& { return o.pair; }, PairCodec{}),
          option<Options>(
              "triples", [](auto& o) -> auto& { return o.triples; }, TriplesCodec{}),
          option<Options>(
              "shape", [](auto& o) -> auto& { return o.shape; },
              ChoiceCodec<Shape>{{{"round", Shape::kRound}, {"square", Shape::kSquare}}})
              .not_hyperparameter()};
}

DocValue text(const std::string& s) {
  DocValue v;
  v.kind = DocValue::Kind::kString;
  v.string_value = s;
  return v;
}

TEST(OptionFields, ShownAsTheConfigShowsThem) {
  Options o;
  o.triples = {{3.4445, -4.775, 2.0315}};
  std::vector<std::string> shown;
  for (const auto& f : fields()) shown.push_back(f.show(o));
  EXPECT_EQ(shown, (std::vector<std::string>{"0.5", "3", "false", "\"\"", "[0.9, 0.999]",
                                             "[[3.4445, -4.775, 2.0315]]", "round"}));
}

TEST(OptionFields, AChoiceReadsItsNamesAndRefusesOthersWithTheList) {
  Options o;
  const auto list = fields();
  const auto& shape = list.back();
  shape.read(o, text("square"), {"f.yaml", "x.shape"});
  EXPECT_EQ(o.shape, Shape::kSquare);
  try {
    shape.read(o, text("oval"), {"f.yaml", "x.shape"});
    FAIL() << "oval was accepted";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "f.yaml: x.shape: must be one of round, square, got 'oval'");
  }
}

TEST(OptionFields, RulesJsonRoundTripAndItsChecks) {
  const auto list = fields();
  Options o;
  o.rate = -1;
  EXPECT_EQ(fields_problem(list, o), "rate must be > 0, got -1");
  o.rate = 0.25;
  o.label = "c";
  EXPECT_EQ(fields_problem(list, o), "label must be one of , a, b, got 'c'");
  o.label = "a";
  EXPECT_EQ(fields_problem(list, o), "");

  o.steps = 7;
  o.on = true;
  o.pair = {0.8, 0.95};
  o.triples = {{1, 2, 3}, {4, 5, 6}};
  o.shape = Shape::kSquare;
  const nlohmann::json saved = fields_to_json(list, o);
  EXPECT_FALSE(saved.contains("shape"));  // not a hyper-parameter
  EXPECT_EQ(saved.at("triples"), nlohmann::json::parse("[[1.0,2.0,3.0],[4.0,5.0,6.0]]"));
  Options back;
  fields_from_json(list, saved, back);
  EXPECT_EQ(back.rate, 0.25);
  EXPECT_EQ(back.steps, 7);
  EXPECT_TRUE(back.on);
  EXPECT_EQ(back.label, "a");
  EXPECT_EQ(back.pair, o.pair);
  EXPECT_EQ(back.triples, o.triples);
  EXPECT_EQ(back.shape, Shape::kRound);  // untouched

  nlohmann::json bad = saved;
  bad["pair"] = {1.0};
  EXPECT_THROW(fields_from_json(list, bad, back), std::invalid_argument);
  bad = saved;
  bad["extra"] = 1;
  EXPECT_THROW(fields_from_json(list, bad, back), std::invalid_argument);  // unexpected field
  bad = saved;
  bad.erase("steps");
  EXPECT_THROW(fields_from_json(list, bad, back), std::invalid_argument);  // missing field
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
