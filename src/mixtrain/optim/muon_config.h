// Muon's config section (config/section.h): its options (MuonOptions, muon.h) and what the
// trainer does around Muon, under optimizer.muon_config.muon_* (TOML: optimizer.muon_*).
//
// The TOML dialect follows torchtitan-npu: the flat [optimizer] table's eps is also the
// Newton-Schulz epsilon and its weight_decay Muon's; momentum ema_add; matched_adamw_rms
// 0.18; muon_hybrid_ns picks the hybrid or legacy schedule (muon_ns_variant names any, not
// both); the Muon lr is muon_lr (falling back to lr) with muon_adjust_lr_fn "original" and lr
// with "match_rms_adamw", where a set muon_lr is ignored with a warning.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/config/load.h"
#include "mixtrain/config/section.h"
#include "mixtrain/optim/muon.h"

namespace mixtrain {

struct MuonConfig {
  MuonOptions options;
  // Newton-Schulz per attention head of q/k/v/o (blocks of model.head_dim), not per matrix.
  bool per_head = false;
  // optimizer.muon_telemetry: orthogonality error and update RMS per group on log steps
  // (muon_telemetry.h).
  bool telemetry = false;
  // QK-clip (MuonClip, qk_clip.h): heads whose max attention logit exceeds this get their q/k
  // projections rescaled after each step. 0 = off.
  double qk_clip_tau = 0.0;
  std::vector<std::string> adamw_keywords;  // extra names routed to AdamW (muon_routing.h)
};

inline const MuonConfig& muon_config(const TrainerConfig& config) {
  return config.optimizer.options.get<MuonConfig>();
}
inline MuonConfig& muon_config(TrainerConfig& config) {
  return config.optimizer.options.get<MuonConfig>();
}

ConfigSectionSpec muon_config_section();

// "Effective muon config:" (config/startup_log.h), or one "not used" line when the target is
// another optimizer.
std::string format_effective_muon_block(const ResolvedConfig& resolved);

}  // namespace mixtrain
