#include "mixtrain/core/utf8.h"

namespace mixtrain {

size_t utf8_sequence_length(std::string_view bytes, size_t i, size_t* maximal_subpart) {
  size_t subpart_storage;
  size_t& subpart = maximal_subpart != nullptr ? *maximal_subpart : subpart_storage;
  const auto lead = static_cast<unsigned char>(bytes[i]);
  subpart = 1;
  if (lead < 0x80) return 1;
  size_t need;                            // continuation bytes
  unsigned char low = 0x80, high = 0xbf;  // range of the first continuation byte
  if (lead >= 0xc2 && lead <= 0xdf) {
    need = 1;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    need = 2;
    if (lead == 0xe0) low = 0xa0;   // no overlong forms
    if (lead == 0xed) high = 0x9f;  // no surrogates
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    need = 3;
    if (lead == 0xf0) low = 0x90;   // no overlong forms
    if (lead == 0xf4) high = 0x8f;  // nothing above U+10FFFF
  } else {
    return 0;  // 0x80-0xc1, 0xf5-0xff never start a sequence
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= bytes.size()) return 0;
    const auto c = static_cast<unsigned char>(bytes[i + k]);
    if (k == 1 ? (c < low || c > high) : (c < 0x80 || c > 0xbf)) return 0;
    subpart = k + 1;
  }
  return need + 1;
}

}  // namespace mixtrain
