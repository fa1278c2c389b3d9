// What a training checkpoint holds and how it goes back in (docs/architecture.md §8;
// fp32-main-params §6.2, 9.1-9.4). The format itself is checkpoint/metadata.h;
// docs/checkpoint.md lists the keys.
//
// Tensors, each a global tensor of which every rank passes the piece it holds (FSDP dim-0 row
// ranges, expert-parallel slices, whole tensors on one rank; replicas are written once):
//   model.<fqn>                                              model dtype
//   optimizer.state.<fqn>.<exp_avg|exp_avg_sq|momentum_buffer|step|normuon_v>    (save_optimizer)
//   optimizer._mixed_precision_optimizer.fp32_from_fp16_params.<fqn>   float32, low-precision
//                                                            params only (none for fp32 models)
// main_grad never. Non-tensor state: train step, LR schedule, data position, loss scaler,
// optimizer param groups (hyper-parameters), the resolved config and its hash, per-rank RNG.
//
// Restore is plan, agree, apply (docs/checkpoint.md): a planning step reads and checks
// everything without changing anything (metadata, files, that the checkpoint is of this model,
// every key, shape and dtype, which main params exist, every checksum of every chunk this rank
// reads, every non-tensor field, the leaves' state values and group hyper-parameters) and
// collects every problem; the ranks agree on them; then an apply step that cannot fail on data
// loads the model, applies model_init_dtype, and loads the optimizer, whose fp32-main-params §9.3
// branches are MixedPrecisionOptimizer::load_state_dict's. Optimizer state saved in another
// floating dtype (fp32_main_params switched between save and restore) is cast to the live state's
// dtype; a run without main params ignores the checkpoint's (its model params are their rounding),
// with one warning. restore_optimizer false: the model only, then reload_model_params()
// (fp32-main-params §9.4). Errors are one DataError naming the checkpoint and every problem.
#pragma once

#include <cstdint>
#include <string>

#include "mixtrain/checkpoint/distributed_checkpoint.h"
#include "mixtrain/config/load.h"
#include "mixtrain/distributed/device_mesh.h"

namespace mixtrain {

class CausalLM;
class FullyShardedModel;
class TrainingOptimizer;
class TokenDataset;

struct CheckpointParts {
  CausalLM& model;
  FullyShardedModel* sharded;  // null: every tensor is whole on this rank
  TrainingOptimizer& optimizer;
  TokenDataset& data;
  const ResolvedConfig& resolved;
  const DeviceMesh& mesh;
};

// This rank's pieces and the state, as of `step` completed steps.
SaveRequest make_save_request(const CheckpointParts& parts, int64_t step);

// Restores from `restore_from` (a step directory, or a checkpoint directory's latest) and
// returns the number of completed steps it holds. Collective over parts.mesh.world.
int64_t restore_checkpoint(const CheckpointParts& parts, const std::string& restore_from,
                           bool restore_optimizer);

// The model's weights only (`mixtrain eval`): the same plan, agree, apply for the model tensors
// (fp32 main params as the values of float32 parameters when the checkpoint has them, then
// model_init_dtype), after the same checks that the checkpoint is of this model and its state is
// whole; no optimizer, data position or RNG. Returns the checkpoint's step. Collective over
// mesh.world; one DataError naming the checkpoint and every problem.
int64_t restore_model_weights(CausalLM& model, FullyShardedModel* sharded,
                              const ResolvedConfig& resolved, const DeviceMesh& mesh,
                              const std::string& restore_from);

}  // namespace mixtrain
