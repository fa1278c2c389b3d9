// core/json_reader: each check's message names the file and the field path, and collect()
// turns a DataError into one more problem while other exceptions pass.
#include "mixtrain/core/json_reader.h"

#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using json = nlohmann::json;

const JsonFieldReader kReader("dir/.metadata.json");

template <typename Read>
std::string error_of(Read read) {
  try {
    read();
  } catch (const DataError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(JsonFieldReader, AcceptsWellTypedValues) {
  const json doc =
      json::parse(R"({"n": 3, "x": 1.5, "b": true, "s": "a", "list": [0, 2], "obj": {"k": 1}})");
  EXPECT_EQ(kReader.integer(doc.at("n"), "n", 0), 3);
  EXPECT_EQ(kReader.number(doc.at("x"), "x"), 1.5);
  EXPECT_EQ(kReader.number(doc.at("n"), "n"), 3.0);  // an integer is a number
  EXPECT_TRUE(kReader.boolean(doc.at("b"), "b"));
  EXPECT_EQ(kReader.string(doc.at("s"), "s"), "a");
  EXPECT_EQ(kReader.integers(doc.at("list"), "list", 0), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(kReader.object(doc, "obj", "obj").at("k"), 1);
  EXPECT_EQ(kReader.optional_member(doc, "absent"), nullptr);
  EXPECT_EQ(kReader.optional_member(doc, "n"), &doc.at("n"));
  EXPECT_EQ(&kReader.list(doc.at("list"), "list"), &doc.at("list"));
}

TEST(JsonFieldReader, NamesTheFileTheFieldAndTheProblem) {
  const json doc = json::parse(
      R"({"n": 1.5, "big": 9223372036854775808, "neg": -2, "x": "1",
          "b": 1, "s": 2, "list": [1, "2"], "obj": [], "notlist": {"a": 1}})");
  const std::string w = "dir/.metadata.json: ";
  EXPECT_EQ(error_of([&] { kReader.member(doc, "m", "state.m"); }), w + "state.m: missing");
  EXPECT_EQ(error_of([&] { kReader.integer(doc.at("n"), "n", 0); }),
            w + "n: must be an integer, got 1.5");
  EXPECT_EQ(error_of([&] { kReader.integer(doc.at("big"), "big", 0); }),
            w + "big: must be an integer, got 9223372036854775808");
  EXPECT_EQ(error_of([&] { kReader.integer(doc.at("neg"), "neg", 0); }),
            w + "neg: must be >= 0, got -2");
  EXPECT_EQ(error_of([&] { kReader.number(doc.at("x"), "x"); }),
            w + "x: must be a number, got \"1\"");
  EXPECT_EQ(error_of([&] { kReader.boolean(doc.at("b"), "b"); }),
            w + "b: must be true or false, got 1");
  EXPECT_EQ(error_of([&] { kReader.string(doc.at("s"), "s"); }), w + "s: must be a string, got 2");
  EXPECT_EQ(error_of([&] { kReader.integers(doc.at("list"), "list", 0); }),
            w + "list[1]: must be an integer, got \"2\"");
  EXPECT_EQ(error_of([&] { kReader.object(doc, "obj", "obj"); }),
            w + "obj: must be an object, got []");
  EXPECT_EQ(error_of([&] { kReader.list(doc.at("notlist"), "notlist"); }),
            w + "notlist: must be a list, got object");
  EXPECT_EQ(error_of([&] { kReader.integers(doc.at("notlist"), "notlist", 0); }),
            w + "notlist: must be a list of integers, got {\"a\":1}");
}

TEST(JsonFieldReader, RefusesNonFiniteNumbers) {
  // JSON text cannot spell infinity (nlohmann refuses 1e400), but a document built in memory
  // can hold one; number() refuses it all the same.
  const json doc = {{"inf", std::numeric_limits<double>::infinity()}};
  EXPECT_EQ(error_of([&] {
              kReader.number(doc.at("inf"), "inf");
            }).rfind("dir/.metadata.json: inf: must be finite", 0),
            0u);
}

TEST(JsonFieldReader, MessagesArePrintable) {
  const json doc = json::parse("{\"k\\u0001\": 1}");
  const std::string message =
      error_of([&] { kReader.string(doc.begin().value(), "state." + doc.begin().key()); });
  EXPECT_EQ(message.find('\x01'), std::string::npos) << message;
  EXPECT_EQ(message.rfind("dir/.metadata.json: state.k", 0), 0u) << message;
}

TEST(Collect, GathersEveryDataErrorAndPassesOtherExceptions) {
  std::vector<std::string> problems;
  const json doc = json::parse(R"({"a": "x", "b": -1, "c": 2})");
  int64_t c = 0;
  EXPECT_FALSE(collect(problems, [&] { kReader.integer(doc.at("a"), "a", 0); }));
  EXPECT_FALSE(collect(problems, [&] { kReader.integer(doc.at("b"), "b", 0); }));
  EXPECT_TRUE(collect(problems, [&] { c = kReader.integer(doc.at("c"), "c", 0); }));
  EXPECT_EQ(c, 2);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0], "dir/.metadata.json: a: must be an integer, got \"x\"");
  EXPECT_EQ(problems[1], "dir/.metadata.json: b: must be >= 0, got -1");
  EXPECT_THROW(collect(problems, [] { throw std::logic_error("bug"); }), std::logic_error);
  EXPECT_EQ(problems.size(), 2u);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
