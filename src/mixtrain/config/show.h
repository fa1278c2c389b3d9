// `mixtrain config show`: every resolved leaf as aligned columns key, value, source and, where
// the dialect spells the key differently or the value was derived, where it came from. Then a
// `note:` line where a value names what runs only indirectly (muon_ns_variant quintic: asym5's
// triples; polar_express: which published set, with its input scaling).
#pragma once

#include <string>

#include "mixtrain/config/load.h"

namespace mixtrain {

std::string format_config_show(const ResolvedConfig& resolved);

// The same table, each line prefixed with `indent` and without the header (start-up log).
std::string format_leaf_table(const ResolvedConfig& resolved, const std::string& indent,
                              bool with_header);

}  // namespace mixtrain
