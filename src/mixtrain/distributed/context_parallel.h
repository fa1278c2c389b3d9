// Context parallelism (docs/architecture.md §7; model/causal_lm.h's ContextParallelHooks): the
// sequence of one batch split over the mesh's cp group, attention over the whole sequence.
//
// Layout (causal load balance): the S tokens are cut into 2 cp equal chunks; cp rank i holds
// chunks i and 2 cp - 1 - i, in that order (context_parallel_slice), so every rank has the same
// number of (query, key) pairs under the causal mask.
//
// attention(q, k, v, kernel), rotate method (parallel.cp_rotate_method):
//   "alltoall" (ring): cp steps; at step s this rank holds the K/V of cp rank (rank - s) mod cp
//     and computes, for each of its two query chunks and each held key chunk, the partial
//     attention (full if the key chunk is earlier, causal if it is the same chunk, skipped if
//     later) with its log-sum-exp; partials merge online: lse = log(e^lse_a + e^lse_b),
//     out = out_a e^(lse_a - lse) + out_b e^(lse_b - lse). Between steps the K/V block moves to
//     the next rank (an all_to_all with rows only for rank + 1; its backward sends the
//     gradient to rank - 1). Collectives are blocking, so shifts do not overlap compute.
//   "allgather": K/V all-gathered once (backward: reduce_scatter_sum of their gradients, in
//     float32), then one attention of the local queries over the whole sequence with the
//     global-position causal mask.
// Numerics follow model/attention.h's kernel, with the log-sum-exp and the merge in float32.
// kFlash on the CPU (ring): LibTorch's CPU flash-attention kernel per chunk pair, as one
// memory-light autograd Function: it keeps no scores; backward runs the kernel's backward per
// pair with the merged output and log-sum-exp, and the float32 K/V gradients walk back along
// the ring to their owner. kMath (and kFlash off the CPU): the partials are composed of
// differentiable tensor ops (autograd keeps each block's scores, as eager attention): Q K^T
// and its scaling in the compute dtype for kMath (float32 for kFlash), softmax in float32, P
// rounded to the compute dtype as the float32 GEMM's operand. "allgather" calls
// scaled_dot_product_attention with the mask (kFlash) or HF's eager attention (kMath).
// float32 results equal causal_attention on the whole sequence to float32 summation order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "mixtrain/core/collectives.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/parallel_plan.h"
#include "mixtrain/model/causal_lm.h"

namespace mixtrain {

enum class CpRotateMethod { kAllToAll, kAllGather };

// "alltoall" or "allgather" (ParallelConfig::cp_rotate_method); std::invalid_argument otherwise.
CpRotateMethod parse_cp_rotate_method(const std::string& name);

// This cp rank's two chunks of `t` along `dim` (size divisible by 2 cp_size), concatenated.
at::Tensor context_parallel_slice(const at::Tensor& t, int64_t cp_rank, int64_t cp_size,
                                  int64_t dim = 1);

// The tokens a rank computes of a [batch, seq] tensor its data rank read: its two chunks with
// context parallelism (mesh.cp > 1), else all of it.
at::Tensor context_parallel_local(const at::Tensor& t, const DeviceMesh& mesh);

class ContextParallel : public ContextParallelHooks {
 public:
  ContextParallel(std::shared_ptr<Collectives> cp_group, CpRotateMethod method);

  int64_t cp_size() const override { return group_->size(); }
  int64_t cp_rank() const override { return group_->rank(); }
  CpRotateMethod method() const { return method_; }
  Collectives& group() const { return *group_; }

  torch::Tensor positions(int64_t local_seq) const override;
  torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          AttentionKernel kernel) override;
  torch::Tensor all_reduce_sum(const torch::Tensor& x) override;
  // QK-clip: k all-gathered once more, without autograd (B Hkv S D elements received per layer
  // and micro-batch, whatever the rotate method), then causal_max_logits of the local queries
  // at their global positions over every key.
  torch::Tensor max_logits(const torch::Tensor& q, const torch::Tensor& k) override;

 private:
  torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, AttentionKernel kernel);
  torch::Tensor allgather_attention(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, AttentionKernel kernel);

  std::shared_ptr<Collectives> group_;
  CpRotateMethod method_;
};

// Step 2 of parallelize (parallelize.h; mesh.cp > 1): places no parameter (the cp ranks are
// part of dp_shard, so FSDP shards over them) and gives the model ContextParallel over
// mesh.cp_group with `method`.
void plan_context_parallel(const DeviceMesh& mesh, CpRotateMethod method, ParallelPlan& plan);

}  // namespace mixtrain
