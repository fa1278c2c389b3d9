// The parallelisms of a CausalLM as steps (docs/architecture.md §7), applied by parallelize() in
// this fixed order, each filling in the plan (parallel_plan.h) without touching the model:
//
//   (pipeline parallelism would come first: which layers this stage keeps; docs/extending.md)
//   1. tensor parallelism   plan_tensor_parallel   (tensor_parallel.h; mesh.tp > 1)
//      the parameters the model splits (CausalLM::tp_dim) are narrowed to this tp rank's slice
//      along that dim; what follows places the slice.
//   2. context parallelism  plan_context_parallel  (context_parallel.h; mesh.cp > 1)
//      places no parameter (cp ranks shard like dp_shard ranks); gives the model ring attention.
//   3. expert parallelism   plan_expert_parallel   (expert_parallel.h; mesh.ep > 1)
//      the routed experts (ParamRole::kExpert) hold this ep rank's slice of whole experts.
//   4. data parallelism     plan_data_parallel     (fsdp.h)
//      every other parameter: FSDP's dim-0 chunk over dp_shard (HSDP with dp_replicate > 1), or
//      replicated (DDP, dp_shard = 1), or whole (one rank).
//
// Then, once every step has agreed (a step's refusal leaves the model as it was), each
// parameter's data is replaced by its planned piece (one copy; the parameter objects keep their
// identity) and the runtime (FullyShardedModel, fsdp.h: gathers in forward, each placement's
// gradient path in backward) is installed as the model's parameter materializer.
#pragma once

#include <memory>

#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/fsdp.h"
#include "mixtrain/model/causal_lm.h"

namespace mixtrain {

// Call after apply_model_init_dtype and before building the optimizer; then, with
// fp32_main_params, pass the optimizer to set_main_grads(). Throws std::invalid_argument for a
// parameter of dimension 0, an unknown dtype name in options.mix_precision, fp32_main_params
// without reduce dtype float32, an expert count the ep group does not divide, or a tp-split
// dimension the tp group does not divide (validate_config refuses each config that would do
// this first).
std::shared_ptr<FullyShardedModel> parallelize(CausalLM& model, const DeviceMesh& mesh,
                                               const FsdpOptions& options);

}  // namespace mixtrain
