// The canonical key table: one entry per leaf of the tree, named by its canonical dotted YAML
// key ("train.steps"), with a typed setter and a formatter: config/'s own leaves, with the
// registered sections' leaves (section.h) in their slot.
//
// The YAML front end reads these keys directly; the TOML front end maps its own keys onto
// them; `config show` and the start-up log list them in this order. A few leaves (dialect,
// source_file, optimizer.routing) are filled in by the loader and cannot be set by a file.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "mixtrain/config/document.h"
#include "mixtrain/config/section.h"
#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

// Every leaf, in display order; the first call freezes the section registry.
const std::vector<LeafSpec>& canonical_leaves();
// The leaf with this canonical key, or nullptr.
const LeafSpec* find_canonical_leaf(const std::string& key);

// Shortest text that reads back as the same double ("0.001", "1e-08", "0.9").
std::string format_number(double value);
std::string format_pair(const std::array<double, 2>& pair);
std::string format_triples(const std::vector<std::array<double, 3>>& triples);
std::string format_string_list(const std::vector<std::string>& strings);

}  // namespace mixtrain
