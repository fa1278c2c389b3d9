// Which leaf optimizer (AdamW or Muon) updates each trainable parameter, with its lr and
// weight decay (docs/architecture.md §5; Muon document "参数路由"; RFC 7.1: the wrapper acts after
// routing).
//
// optimizer._target_ AdamW: every trainable parameter goes to AdamW.
// optimizer._target_ Muon, by optimizer.routing:
//   yaml (hyper-parallel): Muon iff ndim >= 2 and the lower-cased name contains none of
//        embed, lm_head, out_head, out_proj.bias, nor a muon.adamw_keywords entry;
//   toml (torchtitan-npu): 2-D -> Muon unless the name contains embed, lm_head or output;
//        3-D -> Muon; anything else -> AdamW. muon.adamw_keywords (empty unless the user
//        set them) also send a name to AdamW here, so a user keyword is never ignored.
// Weight decay: yaml: AdamW params whose name is_no_decay_parameter get 0, others
// adamw.weight_decay; Muon params muon.weight_decay. toml: the front end put the shared
// weight_decay into both fields and torchtitan applies it to every parameter.
// Parameters with requires_grad false are not routed. A Muon target that routes nothing to
// Muon is a ConfigError naming optimizer._target_.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

enum class OptimizerKind { kAdamW, kMuon };

// "adamw" / "muon".
std::string optimizer_kind_name(OptimizerKind kind);

struct RouteEntry {
  std::string name;
  std::vector<int64_t> shape;
  c10::ScalarType dtype;
  OptimizerKind optimizer;
  double lr;
  double weight_decay;
};

// One entry per trainable parameter, in model order. Throws ConfigError for an unknown
// target or routing dialect, and for a Muon target with no Muon parameter.
std::vector<RouteEntry> route_parameters(
    const std::vector<std::pair<std::string, at::Tensor>>& named_params,
    const OptimizerConfig& config);

// Text table, one line per entry after a header: name, shape, dtype, optimizer, lr,
// weight decay, in aligned columns (logged at start).
std::string format_routing_table(const std::vector<RouteEntry>& routes);

}  // namespace mixtrain
