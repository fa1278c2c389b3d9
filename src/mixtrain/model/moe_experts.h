// A MoE layer's routed experts as one module (qwen2_moe, qwen3_moe, deepseek_v3): three 3-D
// parameters gate_proj, up_proj [E, I, H] and down_proj [E, H, I]; expert e is the SwiGLU MLP
// made of slice e of each (model/routed_experts.h computes it). Every parameter is read through
// the CausalLM materializer (causal_lm.h); the module reports its output to post_forward once,
// for all three. With an ExpertDispatcher of ep_size > 1 (expert parallelism) the parameters
// hold this rank's E / ep experts and the rows travel to the ranks that own their experts.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>

#include "mixtrain/model/layers.h"

namespace mixtrain {

class MoeExperts : public torch::nn::Module {
 public:
  // Registers the parameters uninitialised (init_hf_weights fills them).
  MoeExperts(int64_t num_experts, int64_t hidden_size, int64_t intermediate_size,
             ParamAccess access);

  // hidden [T, H]; selected_experts int64 [T, top_k] (global expert ids) and routing_weights
  // [T, top_k] in hidden's dtype -> sum over the k slots of weight x expert(hidden), [T, H].
  // Sparse dispatch: no expert ever sees a token not routed to it (the grouped form on a device
  // that has LibTorch's grouped GEMM, without a host read; else the loop).
  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& selected_experts,
                        const torch::Tensor& routing_weights);

  torch::Tensor gate_proj, up_proj, down_proj;

 private:
  // Expert parallelism: the parameters hold this rank's E / ep experts only. The (token, slot)
  // rows, sorted by expert as above, go to the ranks owning their experts (token_dispatch),
  // each rank runs its experts on every row it received, the outputs come back
  // (token_combine) in the sorted order and are weighted and added as above. Every rank takes
  // part in both exchanges even when none of its rows leave or arrive, so the collectives (and
  // their backward) line up across the ep group.
  torch::Tensor forward_expert_parallel(ExpertDispatcher& dispatcher, const torch::Tensor& hidden,
                                        const torch::Tensor& selected_experts,
                                        const torch::Tensor& routing_weights);

  int64_t num_experts_;
  ParamAccess access_;
};

}  // namespace mixtrain
