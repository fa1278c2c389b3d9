// The plan the parallelisms fill in, one step after the other (parallelize.h), before any
// parameter is touched: for each parameter how this rank will hold it (its ParamPlacement and
// the dim-0 rows of its tensor-parallel slice), and the communication objects the model's
// forward reaches through its materializer (tensor parallelism's f/g, context parallelism's ring
// attention; expert parallelism's token exchange is built by the runtime, fsdp.h, which owns the
// expert gradients it queues).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/collectives.h"
#include "mixtrain/core/param_placement.h"
#include "mixtrain/distributed/shard_layout.h"

namespace mixtrain {

class CausalLM;
class TensorParallel;
class ContextParallel;

struct PlannedParam {
  std::string name;
  at::Tensor param;  // the registered parameter (whole until parallelize applies the plan)
  // The rows this rank holds of the tensor-parallel slice (the whole parameter without tp):
  // set by expert parallelism (the ep slice) or data parallelism (the dp_shard chunk).
  ShardLayout layout;
  bool expert = false;       // split by expert parallelism: layout is the ep slice
  int64_t tp_dim = -1;       // split over tp along this dim
  ParamPlacement placement;  // global_shape: the model's full shape
};

struct ParallelPlan {
  std::vector<PlannedParam> params;                   // model order
  std::shared_ptr<Collectives> tp_group;              // tensor parallelism (tp > 1), else null
  std::shared_ptr<TensorParallel> tensor_parallel;    // likewise
  std::shared_ptr<ContextParallel> context_parallel;  // context parallelism (cp > 1), else null
  std::shared_ptr<Collectives> ep_group, expert_dp_group;     // expert parallelism (ep > 1)
  std::shared_ptr<Collectives> shard_group, replicate_group;  // data parallelism (always set)
};

// A plan that holds every parameter of `model` whole (kWhole, no tp split, nothing set yet).
// std::invalid_argument for a parameter of dimension 0 (nothing to shard).
ParallelPlan whole_model_plan(CausalLM& model);

}  // namespace mixtrain
