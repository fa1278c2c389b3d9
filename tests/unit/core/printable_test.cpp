// core/printable: every byte sequence becomes one line of valid, printable UTF-8.
#include "mixtrain/core/printable.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

// Independent check of the output: ASCII 0x20-0x7e, or a well-formed multi-byte sequence of a
// code point >= U+00A0 that is no surrogate and <= U+10FFFF (decoded here by arithmetic).
bool is_printable_utf8(const std::string& s, bool allow_newline) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      if ((b < 0x20 && !(allow_newline && b == '\n')) || b == 0x7f) return false;
      ++i;
      continue;
    }
    const size_t n = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = b & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xc0) != 0x80) return false;
      cp = cp << 6 | (c & 0x3f);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp < 0xa0 || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) return false;
    i += n;
  }
  return true;
}

TEST(Printable, KeepsPrintableUtf8) {
  const std::string text =
      "model.layers.0.weight: \xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82 a\\b";
  EXPECT_EQ(printable(text), text);
}

TEST(Printable, EscapesWhatIsNotPrintableUtf8) {
  EXPECT_EQ(printable("ml\xb1p"), "ml\\xb1p");                       // stray continuation byte
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // surrogate U+D800
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(printable("x\xe2\x82"), "x\\xe2\\x82");                  // cut short
  EXPECT_EQ(printable("\x1b[31mred\x7f"), "\\x1b[31mred\\x7f");      // terminal escape, DEL
  EXPECT_EQ(printable("\xc2\x9b"
                      "1m"),
            "\\xc2\\x9b1m");  // C1 CSI
  EXPECT_EQ(printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(printable("two\nlines\t"), "two\\x0alines\\x09");
  EXPECT_EQ(printable("two\nlines", /*keep_newlines=*/true), "two\nlines");
}

// Random byte strings (fixed seed): the result is always printable UTF-8, and printable text
// is a fixed point.
TEST(Printable, AnyBytesGivePrintableUtf8) {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes(rng() % 24, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
    const std::string once = printable(bytes);
    ASSERT_TRUE(is_printable_utf8(once, false)) << trial;
    EXPECT_EQ(printable(once), once) << trial;
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
