// UTF-8 well-formedness, one definition for the project (core/printable, data/bpe_tokenizer).
#pragma once

#include <cstddef>
#include <string_view>

namespace mixtrain {

// Length (1-4) of the well-formed UTF-8 sequence starting at bytes[i] (Unicode table 3-7: no
// overlong forms, no surrogates, nothing above U+10FFFF), or 0 when an ill-formed one starts
// there. Then, if `maximal_subpart` is given, it receives the length (>= 1) of the sequence's
// maximal subpart: the lead byte and the continuation bytes that were still valid, which is what
// one U+FFFD replaces (Unicode 3.9 "U+FFFD substitution of maximal subparts", as Python's
// decoder with errors="replace"). Requires i < bytes.size().
size_t utf8_sequence_length(std::string_view bytes, size_t i, size_t* maximal_subpart = nullptr);

}  // namespace mixtrain
