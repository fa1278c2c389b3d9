// Muon's routing rule (docs/architecture.md §5): with
// optimizer._target_ Muon, which parameters Muon updates, the rest going to AdamW.
//   yaml (hyper-parallel): Muon iff ndim >= 2 and the lower-cased name contains none of
//        embed, lm_head, out_head, out_proj.bias, nor a muon.adamw_keywords entry;
//   toml (torchtitan-npu): 2-D -> Muon unless the name contains embed, lm_head or output;
//        3-D -> Muon; anything else -> AdamW. muon.adamw_keywords (empty unless the user
//        set them) also send a name to AdamW here, so a user keyword is never ignored.
#pragma once

#include "mixtrain/optim/optimizer_table.h"

namespace mixtrain {

// "muon" or "adamw" for a parameter; the error text when no parameter goes to Muon.
extern const RoutingRule kMuonRoutingRule;

}  // namespace mixtrain
