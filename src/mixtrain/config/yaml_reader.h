// YAML text -> DocValue (yaml-cpp), with YAML 1.2 core-schema typing of plain scalars:
// null/~/empty -> null, true/false -> bool, 12 -> int, 1.5 / 1e-3 / .inf -> float, other plain
// or any quoted scalar -> string. Errors are ConfigErrors naming the file (or "--set") and the
// line and column of a syntax error.
#pragma once

#include <string>

#include "mixtrain/config/document.h"

namespace mixtrain {

// Reads a whole file; its top level must be a mapping (an empty file is an empty mapping).
DocValue read_yaml_file(const std::string& path);

// Parses one --set value ("3", "[0.9,0.95]", "bfloat16"); `where` names the override in errors.
DocValue parse_yaml_value(const std::string& text, const Where& where);

}  // namespace mixtrain
