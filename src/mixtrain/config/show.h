// `mixtrain config show`: every resolved leaf as aligned columns key, value, source and, where
// the dialect spells the key differently or the value was derived, where it came from. Then the
// registered sections' `note:` lines (section.h), where a value names what runs only
// indirectly.
#pragma once

#include <string>

#include "mixtrain/config/load.h"

namespace mixtrain {

std::string format_config_show(const ResolvedConfig& resolved);

// The same table, each line prefixed with `indent` and without the header (start-up log).
std::string format_leaf_table(const ResolvedConfig& resolved, const std::string& indent,
                              bool with_header);

}  // namespace mixtrain
