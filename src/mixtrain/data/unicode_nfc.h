// Unicode Normalization Form C (UAX #15) of UTF-8 text: canonical decomposition (Hangul
// algorithmically), canonical ordering of combining marks, canonical composition. For the
// tokenizer's NFC normalizer (data/bpe_tokenizer.h), the normalizer of Qwen2's tokenizer.json.
// Tables: unicode_nfc_tables.inc, generated from Python's unicodedata by
// scripts/gen_unicode_nfc.py (its Unicode version: unicode_nfc_version()).
#pragma once

#include <string>
#include <string_view>

namespace mixtrain {

// NFC of `utf8` (which must be valid UTF-8). Text without a code point that NFC could change
// (no decomposition, no combining class, never the second of a composition) is returned as is
// after one scan.
std::string unicode_nfc(std::string_view utf8);

const char* unicode_nfc_version();

}  // namespace mixtrain
