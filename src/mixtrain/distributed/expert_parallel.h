// Expert parallelism (docs/architecture.md §7, issue 4 part 6): the routed experts split by expert
// over the mesh's ep group, tokens moved to their experts and back with all_to_all.
//
// Layout (parallel.ep > 1; model.num_experts divisible by ep, checked by config validation):
// the ep ranks of one block (DeviceMesh::ep_group, consecutive ranks of a dp_shard row) each
// hold E / ep whole experts, ep rank j experts [j * E/ep, (j+1) * E/ep): the dim-0 slice of
// every expert tensor (the parameters the model gives ParamRole::kExpert, causal_lm.h; for
// qwen2_moe model.layers.N.mlp.experts.*). They are not FSDP-sharded further
// (a dim-0 slice of whole experts is already the unit Muon and the expert GEMMs want) and are
// replicated over expert_dp_group (the ranks holding the same experts). Every other parameter
// stays on the FSDP / DDP path (fsdp.h); the router is replicated, so every rank routes its own
// tokens.
//
// token_dispatch: the per-expert row counts go first (an all_to_all of E/ep counts per peer),
// then the rows (in the compute dtype; bfloat16 travels as bits) to the owning ep rank; the
// received rows (source-rank-major) are regrouped by local expert. token_combine undoes both.
// Each exchange is a torch::autograd::Function whose backward is the reverse all_to_all (the
// gradient of a row goes back to the rank that sent it), so the owner's expert gradient sums
// the contributions of every source rank's loss.
//
// The model runs each expert once per source rank (the GEMM shapes the source would have used
// locally, so results do not depend on the layout) and materializes the expert tensors once
// per source, so each source's weight gradient reaches FullyShardedModel separately and is
// summed there in float32. Expert gradients (fsdp.h): the owner's sum over its ep block's
// losses is summed over expert_dp_group and divided by the number of data-parallel ranks
// (world size), as FSDP divides the other gradients: the gradient of the global batch's mean
// loss, i.e. the single-process gradient. That reduction is deferred to the end of backward (an
// autograd final callback queued by the exchanges' backward, which runs on every rank) so that
// its place in the collective order cannot depend on which experts received tokens where.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/collectives.h"
#include "mixtrain/distributed/parallel_plan.h"
#include "mixtrain/model/causal_lm.h"

namespace mixtrain {

struct DeviceMesh;

// Step 3 of parallelize (parallelize.h; mesh.ep > 1): every routed-expert tensor (the model's
// ParamRole::kExpert, experts on dim 0) is planned as this ep rank's slice of whole experts
// (kExpertSlice over mesh.ep_group, copies over mesh.expert_dp_group; layout offset
// ep_rank * E/ep, rows E/ep); data parallelism leaves them alone. Their gradient path is
// expert_slice_grad.h, driven by the runtime (fsdp.h), which also builds the ExpertParallel token
// exchange. std::invalid_argument when the ep group does not divide an expert count or an expert
// tensor is tensor-parallel split.
void plan_expert_parallel(const CausalLM& model, const DeviceMesh& mesh, ParallelPlan& plan);

class ExpertParallel final : public ExpertDispatcher {
 public:
  // `on_backward` runs inside the backward of every exchange (the owner of the expert
  // gradients queues its end-of-backward reduction there); may be empty.
  ExpertParallel(std::shared_ptr<Collectives> ep_group, std::function<void()> on_backward = {});

  int64_t ep_size() const override { return ep_group_->size(); }
  int64_t ep_rank() const override { return ep_group_->rank(); }
  Collectives& ep_group() const { return *ep_group_; }

  DispatchedTokens token_dispatch(const at::Tensor& tokens,
                                  const std::vector<int64_t>& tokens_per_expert) override;
  at::Tensor token_combine(const at::Tensor& expert_output,
                           const DispatchedTokens& dispatched) override;

  // The differentiable all_to_all both use: rows [offset_i, offset_i + send_counts[i]) go to
  // ep rank i; backward sends the gradient rows back (recv_counts and send_counts swapped).
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts);

 private:
  std::shared_ptr<Collectives> ep_group_;
  std::function<void()> on_backward_;
};

}  // namespace mixtrain
