#include "mixtrain/distributed/parallelize.h"

#include <torch/types.h>

#include <stdexcept>

#include "mixtrain/distributed/context_parallel.h"
#include "mixtrain/distributed/expert_parallel.h"
#include "mixtrain/distributed/tensor_parallel.h"

namespace mixtrain {

ParallelPlan whole_model_plan(CausalLM& model) {
  ParallelPlan plan;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (p.dim() == 0) {
      throw std::invalid_argument("parallelize: parameter " + item.key() +
                                  " has no dim 0 to shard");
    }
    PlannedParam entry;
    entry.name = item.key();
    entry.param = p;
    entry.placement = whole_placement(item.key(), p.sizes().vec());
    plan.params.push_back(std::move(entry));
  }
  return plan;
}

namespace {

// Replaces each parameter's data by its planned piece: the tp slice along tp_dim, then its
// layout rows; parameters held whole keep their tensor.
void apply_plan(const ParallelPlan& plan) {
  torch::NoGradGuard no_grad;
  for (const PlannedParam& p : plan.params) {
    if (!p.expert && p.tp_dim < 0 && plan.shard_group->size() == 1) continue;  // held whole
    at::Tensor slice = p.param.detach();
    if (p.tp_dim >= 0) {
      const int64_t n = slice.size(p.tp_dim) / plan.tp_group->size();
      slice = slice.narrow(p.tp_dim, plan.tp_group->rank() * n, n);
    }
    // Before any optimizer or graph exists (the header's contract), so swapping the data is
    // safe; the TensorImpl, which the module and every later map hold, stays.
    at::Tensor param = p.param;
    param.set_data(
        slice.narrow(0, p.layout.offset, p.layout.rows).clone(at::MemoryFormat::Contiguous));
    if (param.grad().defined()) param.mutable_grad().reset();
  }
}

}  // namespace

std::shared_ptr<FullyShardedModel> parallelize(CausalLM& model, const DeviceMesh& mesh,
                                               const FsdpOptions& options) {
  ParallelPlan plan = whole_model_plan(model);
  if (mesh.tp > 1) plan_tensor_parallel(model, mesh, plan);
  if (mesh.cp > 1)
    plan_context_parallel(mesh, parse_cp_rotate_method(options.cp_rotate_method), plan);
  if (mesh.ep > 1) plan_expert_parallel(model, mesh, plan);
  plan_data_parallel(mesh, plan);
  // The runtime checks its options before the model changes.
  auto fsdp = std::make_shared<FullyShardedModel>(plan, options);
  apply_plan(plan);
  model.set_parameter_materializer(fsdp);
  return fsdp;
}

}  // namespace mixtrain
