// Plain-text tables for logs: every row on one line, columns left-aligned two spaces apart,
// no trailing spaces. Rows may have different lengths (missing cells are empty).
#pragma once

#include <string>
#include <vector>

namespace mixtrain {

// Each row as `indent` + its cells, padded to the widest cell of each column, "\n"-terminated.
std::string format_text_table(const std::vector<std::vector<std::string>>& rows,
                              const std::string& indent = "  ");

}  // namespace mixtrain
