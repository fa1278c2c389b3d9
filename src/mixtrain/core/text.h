// Small text helpers for messages, logs and key parsing: one spelling of each in the project.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mixtrain {

bool starts_with(std::string_view text, std::string_view prefix);
bool ends_with(std::string_view text, std::string_view suffix);

// ASCII lower case ("AdamW" -> "adamw"); other bytes unchanged.
std::string to_lower(std::string text);

// The parts with `separator` between them ("" for none).
std::string join(const std::vector<std::string>& parts, std::string_view separator);

// "[2, 3]", "[a, b]"; "[]" when empty. A shape prints as its list.
std::string format_list(c10::ArrayRef<int64_t> values);
std::string format_list(const std::vector<std::string>& values);

}  // namespace mixtrain
