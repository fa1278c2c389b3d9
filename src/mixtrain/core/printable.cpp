#include "mixtrain/core/printable.h"

#include <cstdint>
#include <cstdio>

#include "mixtrain/core/utf8.h"

namespace mixtrain {
namespace {

void escape(std::string& out, unsigned char byte) {
  char buffer[5];
  std::snprintf(buffer, sizeof(buffer), "\\x%02x", byte);
  out += buffer;
}

}  // namespace

std::string printable(std::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const size_t length = utf8_sequence_length(text, i);
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
