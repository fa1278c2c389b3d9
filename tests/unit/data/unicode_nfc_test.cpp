// NFC against Python's unicodedata.normalize("NFC") (tests/python/hf_tokenizer_reference.py nfc)
// on random strings rich in combining marks, Hangul jamo and precomposed letters, and on cases
// whose answers come from the Unicode Character Database by hand.
#include "mixtrain/data/unicode_nfc.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/python_script.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

std::string nfc_from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return out;
}

TEST(UnicodeNfc, HandCheckedCases) {
  EXPECT_EQ(unicode_nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(unicode_nfc("e\xCC\x81"), "\xC3\xA9");     // e + U+0301 -> é
  EXPECT_EQ(unicode_nfc("\xE2\x84\xAB"), "\xC3\x85");  // U+212B ANGSTROM SIGN -> Å
  EXPECT_EQ(unicode_nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> 각
  EXPECT_EQ(unicode_nfc("\xEA\xB0\x80\xE1\x86\xA8"), "\xEA\xB0\x81");              // 가 + T -> 각
  // a + U+0302 (class 230) + U+0323 (class 220): reordered, then composed: U+1EAD.
  EXPECT_EQ(unicode_nfc("a\xCC\x82\xCC\xA3"), "\xE1\xBA\xAD");
  // U+0958 DEVANAGARI LETTER QA is excluded from composition: stays U+0915 U+093C.
  EXPECT_EQ(unicode_nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");
  // Blocked: U+0301 after U+0323 (220 < 230) still composes with q? No composite exists for
  // q + U+0301, so the text is only reordered: q U+0323 U+0307 -> q U+0323 U+0307.
  EXPECT_EQ(unicode_nfc("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");
}

TEST(UnicodeNfc, MatchesPythonUnicodedata) {
  const std::filesystem::path file = std::filesystem::temp_directory_path() /
                                     ("mixtrain_nfc_" + std::to_string(::getpid()) + ".json");
  ASSERT_TRUE(
      test_support::python_script_succeeds({"hf_tokenizer_reference.py", "nfc", file.string()}));
  std::ifstream in(file);
  const nlohmann::json reference = nlohmann::json::parse(in);
  std::filesystem::remove(file);
  // The tables were generated from a Python of the same Unicode version (else regenerate them
  // with scripts/gen_unicode_nfc.py).
  ASSERT_EQ(reference.at("unicode"), unicode_nfc_version());
  int mismatched = 0, changed = 0;
  for (const auto& c : reference.at("cases")) {
    const std::string text = nfc_from_hex(c.at("hex")), expected = nfc_from_hex(c.at("nfc_hex"));
    changed += text != expected;
    if (unicode_nfc(text) != expected && ++mismatched <= 5) {
      ADD_FAILURE() << "NFC differs for hex " << c.at("hex").get<std::string>();
    }
  }
  EXPECT_EQ(mismatched, 0);
  EXPECT_GT(changed, 1000);  // most cases exercise decomposition, reordering or composition
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
