// TOML file -> DocValue (toml11). Tables become maps (sorted by key), arrays lists; dates and
// times are rejected (no config key takes one). Errors are ConfigErrors naming the file and,
// for syntax errors, the line.
#pragma once

#include <string>

#include "mixtrain/config/document.h"

namespace mixtrain {

DocValue read_toml_file(const std::string& path);

}  // namespace mixtrain
