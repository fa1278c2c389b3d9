// Refuses to train when ranks resolved different configs (issue 4 part 2).
//
// Every rank hashes (XXH3-64) the text the caller gives (the `config show` text of its resolved
// config) and the hashes are all-gathered over mesh.world. If any differs, the texts are
// all-gathered too and every rank throws the same UserError naming the ranks whose config
// differs from rank 0's and, for the first of them, the first differing line of each. Collective:
// every rank calls it at the same point; a dead or hung peer fails it like any collective.
#pragma once

#include <string>

#include "mixtrain/distributed/device_mesh.h"

namespace mixtrain {

void check_config_agreement(const DeviceMesh& mesh, const std::string& resolved_config_text);

}  // namespace mixtrain
