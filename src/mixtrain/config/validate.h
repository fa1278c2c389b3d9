// Range and cross-key checks on a translated TrainerConfig, run before anything is built.
//
// The first violation throws ConfigError "<file or --set>: <key>: <rule>, got <value>", with the
// key spelled as the user wrote it (TOML keys for TOML files). The RFC's case 2.5 is here:
// fp32_main_params: true requires fsdp_config.mix_precision.reduce_dtype: float32, and the
// reduce dtype is never filled in on the user's behalf.
#pragma once

#include "mixtrain/config/provenance.h"
#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

void validate_config(const TrainerConfig& config, const Provenance& provenance);

}  // namespace mixtrain
