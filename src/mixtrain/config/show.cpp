#include "mixtrain/config/show.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "mixtrain/config/section.h"

namespace mixtrain {
namespace {

std::string pad(const std::string& text, size_t width) {
  return text + std::string(width > text.size() ? width - text.size() : 0, ' ');
}

}  // namespace

std::string format_leaf_table(const ResolvedConfig& resolved, const std::string& indent,
                              bool with_header) {
  size_t key_width = 3, value_width = 5, source_width = 6;
  for (const ResolvedLeaf& leaf : resolved.leaves) {
    key_width = std::max(key_width, leaf.key.size());
    value_width = std::max(value_width, leaf.value.size());
    source_width = std::max(source_width, std::string(value_source_name(leaf.source)).size());
  }
  std::ostringstream out;
  auto row = [&](const std::string& key, const std::string& value, const std::string& source,
                 const std::string& origin) {
    std::string line = indent + pad(key, key_width + 2) + pad(value, value_width + 2) +
                       (origin.empty() ? source : pad(source, source_width + 2) + origin);
    out << line << "\n";
  };
  if (with_header) row("key", "value", "source", "from");
  for (const ResolvedLeaf& leaf : resolved.leaves) {
    row(leaf.key, leaf.value, value_source_name(leaf.source), leaf.origin);
  }
  return out.str();
}

std::string format_config_show(const ResolvedConfig& resolved) {
  std::string text = format_leaf_table(resolved, "", true);
  for (const ConfigSectionSpec& section : config_sections()) {
    if (!section.notes) continue;
    for (const std::string& note : section.notes(resolved.config)) text += note + "\n";
  }
  return text;
}

}  // namespace mixtrain
