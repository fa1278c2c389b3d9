// Range and cross-key checks on a translated TrainerConfig, run before anything is built.
//
// The first violation throws ConfigError "<file or --set>: <key>: <rule>, got <value>", with the
// key spelled as the user wrote it (TOML keys for TOML files). fp32-main-params §2.5 is here:
// fp32_main_params: true requires fsdp_config.mix_precision.reduce_dtype: float32, and the
// reduce dtype is never filled in on the user's behalf.
//
// load_config validates every file; the Trainer and optim-replay validate again the config they
// are given, so a TrainerConfig built or changed in code is held to the same rules. Everything
// decidable from the config alone is checked here, not in the layers that build from it; what
// only a build step can know is thrown there with the canonical key (core/error.h ConfigKey).
#pragma once

#include <string>
#include <vector>

#include "mixtrain/config/provenance.h"
#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

void validate_config(const TrainerConfig& config, const Provenance& provenance);

// The same checks for a config without provenance (built in code): errors name the canonical
// key and start with config.source_file, or "TrainerConfig (built in code)" when it is empty.
void validate_config(const TrainerConfig& config);

// A loaded config (possibly changed in code since): its provenance spells the keys as the user
// wrote them; one built in code (empty provenance) gets the canonical keys as above.
struct ResolvedConfig;
void validate_config(const ResolvedConfig& resolved);

// Settings that are valid but do less than their name says, one line each naming the keys as
// the config's dialect spells them. Empty for most configs; the trainer logs them at start.
std::vector<std::string> config_warnings(const TrainerConfig& config);

}  // namespace mixtrain
