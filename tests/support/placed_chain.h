// The two-parameter optimizer of the placement tests (placed_grad_clip_test, placed_found_inf_test)
// on a 2-rank mesh: "shard", a [4, 3] parameter sharded by dim 0 over dp_shard (this rank holds
// rows [2 * rank, 2 * rank + 2)), and "replicated", a [5] parameter every rank holds whole
// (kReplicated over the world); SGD, lr 0.1. Its gradients are the test's to set.
#pragma once

#include <ATen/ATen.h>

#include <memory>

#include "mixtrain/core/param_placement.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "support/test_sgd.h"

namespace mixtrain::testing {

struct PlacedChain {
  at::Tensor shard = at::zeros({2, 3}).requires_grad_(true);
  at::Tensor replicated = at::zeros({5}).requires_grad_(true);
  ChainedOptimizer chain;
};

inline std::unique_ptr<PlacedChain> make_placed_chain(const DeviceMesh& mesh) {
  auto placed = std::make_unique<PlacedChain>();
  placed->chain.add_leaf(test_doubles::make_sgd({placed->shard, placed->replicated}, 0.1),
                         {{"shard", placed->shard}, {"replicated", placed->replicated}});
  ParamPlacement dim0 = whole_placement("shard", {4, 3});
  dim0.kind = ParamPlacement::Kind::kDim0Shard;
  dim0.offset = 2 * mesh.rank;
  dim0.rows = 2;
  dim0.shard_group = mesh.dp_shard_group;
  dim0.replicate_group = mesh.dp_replicate_group;  // one rank: no HSDP copies
  ParamPlacement rep = whole_placement("replicated", {5});
  rep.kind = ParamPlacement::Kind::kReplicated;
  rep.replicate_group = mesh.world;
  placed->chain.set_placements({dim0, rep});
  return placed;
}

}  // namespace mixtrain::testing
