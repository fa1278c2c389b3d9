// core/text.h: prefixes and suffixes at the edges, joins and list formats of 0, 1 and 3 items.
#include "mixtrain/core/text.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(TextTest, StartsAndEndsWith) {
  EXPECT_TRUE(starts_with("optimizer.state.w", "optimizer."));
  EXPECT_TRUE(starts_with("abc", ""));
  EXPECT_TRUE(starts_with("abc", "abc"));
  EXPECT_FALSE(starts_with("ab", "abc"));
  EXPECT_FALSE(starts_with("xabc", "abc"));
  EXPECT_TRUE(ends_with("config.yaml", ".yaml"));
  EXPECT_TRUE(ends_with("abc", ""));
  EXPECT_FALSE(ends_with("c", "abc"));
  EXPECT_FALSE(ends_with("config.yaml.bak", ".yaml"));
}

TEST(TextTest, JoinPutsTheSeparatorBetweenParts) {
  EXPECT_EQ(join({}, ", "), "");
  EXPECT_EQ(join({"a"}, ", "), "a");
  EXPECT_EQ(join({"a", "", "c"}, "+"), "a++c");
}

TEST(TextTest, FormatListOfNumbersAndStrings) {
  EXPECT_EQ(format_list(std::vector<int64_t>{}), "[]");
  EXPECT_EQ(format_list(std::vector<int64_t>{7}), "[7]");
  EXPECT_EQ(format_list(std::vector<int64_t>{2, -3, 4000000000}), "[2, -3, 4000000000]");
  EXPECT_EQ(format_list(std::vector<std::string>{"x", "y z"}), "[x, y z]");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
