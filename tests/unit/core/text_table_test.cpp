#include "mixtrain/core/text_table.h"

#include <gtest/gtest.h>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(TextTable, AlignsColumnsTwoSpacesApartWithoutTrailingSpaces) {
  // Column widths 4 ("name", "lr") and 5 ("0.001"); the last cell of a row is never padded.
  EXPECT_EQ(format_text_table({{"name", "lr", "x"}, {"a", "0.001", "yy"}, {"bb"}}),
            "  name  lr     x\n"
            "  a     0.001  yy\n"
            "  bb\n");
  EXPECT_EQ(format_text_table({{"k", "v"}}, ""), "k  v\n");
  EXPECT_EQ(format_text_table({}), "");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
