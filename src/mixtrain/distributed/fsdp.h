// Data parallelism (FSDP / HSDP / DDP) for a CausalLM, and the runtime of every parallelism
// (docs/architecture.md §3, §7; fp32-main-params §5.3 and 8.1): the model's parameter
// materializer (model/causal_lm.h) with a custom autograd Function. parallelize.h applies the
// parallelisms as steps; plan_data_parallel below is the last of them, FullyShardedModel runs
// the plan they made.
//
// Placement (plan_data_parallel): every parameter not placed by expert parallelism holds this
// rank's dim-0 chunk of its tensor-parallel slice (the whole parameter without tp) over
// mesh.dp_shard_group (torch.chunk semantics: chunk = ceil(d0 / n), rank r holds rows
// [r*chunk, min(d0, (r+1)*chunk)), trailing ranks may hold fewer or zero rows; padding exists
// only on the wire), in the parameter's dtype; with dp_shard == 1 nothing is sharded (DDP over
// dp_replicate, or one rank).
//
// Forward: unshard(name) all-gathers the shard in param_dtype (bfloat16 travels as bits) into a
// freshly allocated full parameter (DDP: casts to param_dtype); the logits are cast to
// output_dtype, floating inputs to param_dtype (cast_forward_inputs).
// Backward (all_gather_params' backward = reduce_scatter_main_grads): the full gradient, in
// float32, is reduce-scattered over dp_shard, all-reduced over dp_replicate (HSDP, DDP) and
// divided by the number of data-parallel ranks (each rank's loss is a mean over its own
// batch), then rounded to reduce_dtype (unset: kept as reduced, in float32; fp32_main_params
// requires it set to float32, fp32-main-params §2.5: validate_config refuses it in the user's keys,
// and parallelize, given such options in code, throws std::invalid_argument). With
// fp32_main_params: added to main_grad(name) of the attached optimizer (accumulating over
// micro-batches) and no gradient is returned, so .grad stays empty (fp32-main-params §8.1);
// otherwise returned in the parameter's dtype and accumulated in .grad. Reductions run in float32
// whatever reduce_dtype says (Gloo cannot reduce bfloat16).
// Each placement's gradient path is its own file: dim0_shard_grad.h (FSDP rows, HSDP/DDP copies,
// a whole parameter) and expert_slice_grad.h (routed experts under expert parallelism: unshard
// only casts them; their gradients are summed over expert_dp_group and divided by the number of
// data-parallel ranks at the end of backward, an autograd final callback, then delivered like
// every other gradient). The model reaches the token exchange through expert_dispatcher(),
// tensor parallelism's communication through tensor_parallel() and context parallelism's
// through context_parallel() (nullptr when that degree is 1).
//
// Under tensor parallelism layout(), unshard, gather_full and local_rows all speak of the tp
// slice (its shape is layout().global_shape); placements() carry the whole picture: global_shape
// the full (Hugging Face) shape, tp_dim and tp_group. A caller needing a global tensor of a
// TP-split parameter must also gather over placement().tp_group along tp_dim (gather_global).
//
// Memory: the full parameter's storage is freed in the reduce-scatter (after backward at the
// latest). reshard_after_forward (torch FSDP2's default) frees it as soon as the module that
// used it has finished its forward (post_forward) and gathers it again, into the same storage,
// in an autograd node on the module's output, i.e. right before that module's backward. This
// covers every parameter of the model (linear layers, embedding, norms, the 3-D experts).
//
// Collectives run inside autograd nodes; the CPU autograd engine runs nodes in decreasing
// creation order, and the model creates them in the same order on every rank, so all ranks
// issue the same collectives in the same order even when MoE routing differs between ranks.
// One backward per forward (retain_graph is not supported). The FullyShardedModel is held by
// the model (as its materializer), so graphs stay valid while the model lives.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/core/collectives.h"
#include "mixtrain/core/main_grad_sink.h"
#include "mixtrain/core/param_placement.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/expert_parallel.h"
#include "mixtrain/distributed/expert_slice_grad.h"
#include "mixtrain/distributed/parallel_plan.h"
#include "mixtrain/distributed/shard_layout.h"
#include "mixtrain/distributed/tensor_parallel.h"
#include "mixtrain/model/causal_lm.h"

namespace mixtrain {

struct FsdpOptions {
  MixPrecisionConfig mix_precision;  // param_dtype, reduce_dtype, output_dtype
  bool fp32_main_params = false;  // optimizer.fp32_main_params (fp32-main-params §5.3: one switch)
  bool reshard_after_forward = true;          // fsdp_config.reshard_after_forward
  std::string cp_rotate_method = "alltoall";  // parallel.cp_rotate_method (context_parallel.h)
};

class FullyShardedModel : public ParameterMaterializer {
 public:
  // Use parallelize() (parallelize.h): the runtime of a plan every step has filled in. Throws
  // std::invalid_argument for an unknown dtype name in options.mix_precision or fp32_main_params
  // without reduce dtype float32; touches no parameter.
  FullyShardedModel(const ParallelPlan& plan, FsdpOptions options);

  // fp32_main_params: where the reduced gradients go (the optimizer built on the sharded params,
  // accumulate_main_grad(name, grad)). Must be set before the first backward.
  void set_main_grads(MainGradSink* sink) { main_grads_ = sink; }

  const FsdpOptions& options() const { return options_; }
  c10::ScalarType param_dtype() const { return param_dtype_; }
  Collectives& shard_group() const { return *shard_group_; }
  Collectives& replicate_group() const { return *replicate_group_; }
  // Names in model order.
  const std::vector<std::string>& names() const { return names_; }
  // FSDP's dim-0 split of `name`'s tp slice (the whole parameter without tensor parallelism;
  // under tp, global_shape is the tp slice's shape, not the model's).
  const ShardLayout& layout(const std::string& name) const;
  // All-gathers a tensor shaped like `name`'s local shard (any dtype Collectives carries, e.g. a
  // main param or main_grad) over the dp_shard group (the ep group for expert slices): the whole
  // parameter without tensor parallelism, this rank's tp slice with it (gather that over
  // placement(name).tp_group along tp_dim for the global tensor). Collective.
  at::Tensor gather_full(const std::string& name, const at::Tensor& local) const;
  // The global tensor (the model's whole parameter shape) of a tensor shaped like `name`'s
  // local shard: gather_full, then with tensor parallelism the tp slices along tp_dim.
  // Collective over the shard group and, for a tp-split parameter, the tp group.
  at::Tensor gather_global(const std::string& name, const at::Tensor& local) const;
  // gather_global of each locals[i] (shaped like names[i]'s local shard), bitwise the same, with
  // one all_gather per process group and dtype instead of one per tensor: a test that records
  // every parameter each step on 8 ranks spent most of its time in those round trips.
  // Collective: every rank passes the same names in the same order.
  std::vector<at::Tensor> gather_global(const std::vector<std::string>& names,
                                        const std::vector<at::Tensor>& locals) const;
  // This rank's rows of a tensor shaped like layout(name).global_shape (the tp slice under
  // tensor parallelism), a view.
  at::Tensor local_rows(const std::string& name, const at::Tensor& full) const;
  // How each parameter is held (core/param_placement.h), in model order: routed experts under
  // expert parallelism kExpertSlice (over ep, copies over expert_dp); otherwise kDim0Shard over
  // dp_shard (copies over dp_replicate) when dp_shard > 1, kReplicated over dp_replicate
  // (DDP) when only that has several ranks, kWhole otherwise. Under tensor parallelism a split
  // parameter's placement has tp_dim / tp_group, global_shape the full shape and offset/rows
  // its dim-0 rows of the tp slice (tp_shape()).
  const std::vector<ParamPlacement>& placements() const { return placements_; }
  // Throws std::invalid_argument for an unknown name.
  const ParamPlacement& placement(const std::string& name) const;

  // ParameterMaterializer
  at::Tensor unshard(const std::string& name, const at::Tensor& param) override;
  at::Tensor post_forward(const std::vector<std::string>& names, const at::Tensor& output) override;
  at::Tensor cast_forward_input(const at::Tensor& input) override;
  at::Tensor cast_forward_output(const at::Tensor& output) override;
  ExpertDispatcher* expert_dispatcher() override { return expert_parallel_.get(); }
  ContextParallelHooks* context_parallel() override;
  TensorParallelHooks* tensor_parallel() override;
  // Whether parameter `name` is split by expert parallelism (not FSDP-sharded).
  bool is_expert_parallel(const std::string& name) const;

  // Implementation, used by the autograd nodes in fsdp.cpp. param: the local piece.
  using Param = PlannedParam;
  const Param& param(int64_t index) const { return params_[index]; }
  int64_t index_of(const std::string& name) const;
  // Fills `full` (param_dtype, global shape, contiguous) from the shards.
  void all_gather_into(int64_t index, const at::Tensor& full) const;
  // The reduced gradient for the local shard, or undefined when it went to main_grad.
  at::Tensor reduce_scatter_main_grads(int64_t index, const at::Tensor& full_grad);

 private:
  std::shared_ptr<Collectives> shard_group_, replicate_group_;
  FsdpOptions options_;
  c10::ScalarType param_dtype_, output_dtype_;
  std::optional<c10::ScalarType> reduce_dtype_;  // unset: no rounding after the reduction
  std::vector<Param> params_;
  std::vector<std::string> names_;
  std::vector<ParamPlacement> placements_;  // by param index
  std::unordered_map<std::string, int64_t> index_;
  // Storage of each parameter's full tensor gathered in the current forward, until its
  // module's post_forward hands it to the pre-backward node.
  std::vector<c10::Storage> full_storages_;
  MainGradSink* main_grads_ = nullptr;
  // Expert parallelism: the token exchange, the expert_dp group, the expert gradients of the
  // running backward (float32, by param index; reduced by sync_expert_grads) and whether the
  // end-of-backward reduction is queued.
  std::shared_ptr<Collectives> ep_group_, expert_dp_group_;
  std::shared_ptr<ExpertParallel> expert_parallel_;
  ExpertSliceGrads expert_grads_;  // expert_slice_grad.h
  bool expert_sync_queued_ = false;
  std::shared_ptr<ContextParallel> context_parallel_;  // null when cp = 1
  std::shared_ptr<Collectives> tp_group_;              // null when tp = 1
  std::shared_ptr<TensorParallel> tensor_parallel_;    // null when tp = 1
  void queue_expert_grad_sync();
  void sync_expert_grads();
  void deliver_grad(const Param& p, at::Tensor grad);
};

// Step 4 of parallelize (parallelize.h): every parameter expert parallelism did not place gets
// its dim-0 chunk of its tp slice over mesh.dp_shard_group (kDim0Shard, copies over
// dp_replicate_group) when dp_shard > 1, else is replicated over dp_replicate_group
// (kReplicated, DDP) when that has several ranks, else stays whole (kWhole).
void plan_data_parallel(const DeviceMesh& mesh, ParallelPlan& plan);

}  // namespace mixtrain
