// utf8_sequence_length against the Unicode standard: table 3-7 (well-formed sequences) and the
// worked example of table 3-8 (U+FFFD substitution of maximal subparts).
#include "mixtrain/core/utf8.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

struct Case {
  std::string bytes;
  size_t length;   // expected length at offset 0 (0: ill-formed)
  size_t subpart;  // expected maximal subpart
};

TEST(Utf8, SequenceLengthFollowsTable3_7) {
  const std::vector<Case> cases = {
      {"a", 1, 1},
      {"\xc3\xa9", 2, 2},          // U+00E9
      {"\xe2\x82\xac", 3, 3},      // U+20AC
      {"\xf0\x9f\x98\x80", 4, 4},  // U+1F600
      {"\xf4\x8f\xbf\xbf", 4, 4},  // U+10FFFF, the last code point
      {"\xc0\x80", 0, 1},          // overlong (C0, C1 never lead)
      {"\xe0\x80\x80", 0, 1},      // overlong: E0 needs A0..BF next
      {"\xed\xa0\x80", 0, 1},      // surrogate U+D800: ED needs 80..9F next
      {"\xf4\x90\x80\x80", 0, 1},  // above U+10FFFF
      {"\xf5\x80", 0, 1},          // F5..FF never lead
      {"\x80", 0, 1},              // a lone continuation byte
      {"\xe2\x82\x41", 0, 2},      // third byte not a continuation
      {"\xf0\x9f\x98\x41", 0, 3},  // fourth byte not a continuation
      {"\xe2\x82", 0, 2},          // truncated at the end
  };
  for (const auto& c : cases) {
    size_t subpart = 99;
    EXPECT_EQ(utf8_sequence_length(c.bytes, 0, &subpart), c.length)
        << testing::PrintToString(c.bytes);
    EXPECT_EQ(subpart, c.subpart) << testing::PrintToString(c.bytes);
    EXPECT_EQ(utf8_sequence_length(c.bytes, 0), c.length);  // the subpart is optional
  }
}

TEST(Utf8, MaximalSubpartsGiveTable3_8) {
  // Unicode 15, table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 decodes, replacing each
  // maximal subpart by one U+FFFD, to 0061 FFFD FFFD FFFD 0062 FFFD 0063 FFFD FFFD 0064.
  const std::string bytes = "\x61\xf1\x80\x80\xe1\x80\xc2\x62\x80\x63\x80\xbf\x64";
  std::string decoded;  // one letter per unit: the ASCII byte, or '?' for a U+FFFD
  for (size_t i = 0; i < bytes.size();) {
    size_t subpart = 0;
    const size_t length = utf8_sequence_length(bytes, i, &subpart);
    if (length == 0) {
      decoded += '?';
      i += subpart;
    } else {
      decoded += bytes[i];
      i += length;
    }
  }
  EXPECT_EQ(decoded, "a???b?c??d");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
