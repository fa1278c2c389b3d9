#include "mixtrain/core/printable.h"

#include <cstdint>
#include <cstdio>

namespace mixtrain {
namespace {

void escape(std::string& out, unsigned char byte) {
  char buffer[5];
  std::snprintf(buffer, sizeof(buffer), "\\x%02x", byte);
  out += buffer;
}

// Length of the well-formed UTF-8 sequence starting at text[i] (fp32-main-params §3629 / Unicode
// table 3-7), 0 if there is none.
size_t sequence_length(std::string_view text, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char lead = at(0);
  size_t length;
  unsigned char low = 0x80, high = 0xbf;  // allowed range of the second byte
  if (lead < 0x80) return 1;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;   // no overlong forms
    if (lead == 0xed) high = 0x9f;  // no surrogates
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;   // no overlong forms
    if (lead == 0xf4) high = 0x8f;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (at(1) < low || at(1) > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (at(k) < 0x80 || at(k) > 0xbf) return 0;
  }
  return length;
}

}  // namespace

std::string printable(std::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const size_t length = sequence_length(text, i);
    const bool control = byte < 0x20 || byte == 0x7f;
    // U+0080-U+009F is 0xc2 0x80-0x9f.
    const bool c1 = length == 2 && byte == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0;
    if (length == 0 || (control && !(keep_newlines && byte == '\n')) || c1) {
      for (size_t k = 0; k < (c1 ? 2 : 1); ++k)
        escape(out, static_cast<unsigned char>(text[i + k]));
      i += c1 ? 2 : 1;
      continue;
    }
    out.append(text.substr(i, length));
    i += length;
  }
  return out;
}

}  // namespace mixtrain
