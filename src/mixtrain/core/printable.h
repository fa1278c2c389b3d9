// Text from files (checkpoint metadata, safetensors headers, configs) made safe to put into an
// error or log line: the text may hold any bytes, a message must not.
#pragma once

#include <string>
#include <string_view>

namespace mixtrain {

// `text` with every byte that is not part of a well-formed UTF-8 sequence (stray continuation
// bytes, overlong forms, surrogates, code points above U+10FFFF, a sequence cut short), every
// C0 control character, DEL and every C1 control (U+0080-U+009F) written as \xNN per byte;
// a backslash stays as it is. Printable UTF-8 passes unchanged. keep_newlines keeps '\n' (for
// messages that are several lines by design); otherwise it becomes \x0a like the others.
std::string printable(std::string_view text, bool keep_newlines = false);

}  // namespace mixtrain
