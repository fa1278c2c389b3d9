#include "mixtrain/core/text.h"

#include <algorithm>
#include <cctype>

namespace mixtrain {

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += separator;
    out += parts[i];
  }
  return out;
}

std::string to_lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string format_list(c10::ArrayRef<int64_t> values) {
  std::vector<std::string> parts;
  for (const int64_t v : values) parts.push_back(std::to_string(v));
  return format_list(parts);
}

std::string format_list(const std::vector<std::string>& values) {
  return "[" + join(values, ", ") + "]";
}

}  // namespace mixtrain
