// A MoE layer's routed experts on one rank (every expert local): the SwiGLU MLP of expert e,
// down_e(silu(gate_e x) * up_e x), applied to the tokens routed to it and weighted by their
// routing weight; each token's top-k outputs summed. Two forms:
//   loop     the (token, slot) rows sorted by expert (stable), then per expert: its rows
//            gathered, its three GEMMs, weighted, index_add_ into the output. The host reads
//            the tokens per expert to size each GEMM (core/host_sync.h: one read per call).
//            The CPU form: its bits are the ones every CPU test and checkpoint knows.
//   grouped  the same sorted rows through three grouped GEMMs (at::_grouped_mm, one per
//            projection for every expert at once) whose group ends are computed on the device:
//            no host read. The rows go back to slot order (a permutation) and each token's k
//            weighted outputs are summed in one reduction (float32 accumulation, rounded once,
//            where the loop rounds after each expert's add): deterministic, and within a few
//            ulps of the loop. The CUDA form where LibTorch has the kernel.
// hidden [T, H]; selected [T, k] int64 expert ids; weights [T, k] in hidden's dtype; gate and
// up [E, I, H], down [E, H, I] (the experts' stacked weights) -> [T, H] in hidden's dtype.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace mixtrain {

// The (token, slot) rows sorted by expert (a stable sort: tokens stay in order within an
// expert, so every later sum is independent of the sort implementation), each row's token and
// routing weight, and the rows per expert as the host reads them (one counted read). The loop
// form's and expert parallelism's dispatch (model/moe_experts.cpp).
struct ExpertRows {
  torch::Tensor order;        // [T * k] row -> its (token, slot) index, in expert order
  torch::Tensor token_index;  // [T * k] its token
  torch::Tensor weights;      // [T * k] its routing weight
  std::vector<int64_t> per_expert;
};
ExpertRows rows_by_expert(const torch::Tensor& selected, const torch::Tensor& weights,
                          int64_t experts);

torch::Tensor routed_experts_loop(const torch::Tensor& hidden, const torch::Tensor& selected,
                                  const torch::Tensor& weights, const torch::Tensor& gate,
                                  const torch::Tensor& up, const torch::Tensor& down);
torch::Tensor routed_experts_grouped(const torch::Tensor& hidden, const torch::Tensor& selected,
                                     const torch::Tensor& weights, const torch::Tensor& gate,
                                     const torch::Tensor& up, const torch::Tensor& down);

// Whether the model takes the grouped form for these tensors: a CUDA device of compute
// capability >= 9.0 (LibTorch's grouped GEMM), bfloat16, every dimension a multiple of 8 and
// the weights contiguous from 16-byte aligned addresses (the kernel reads 16-byte rows; an
// FSDP-unsharded weight is a view into a flat buffer and may start anywhere).
bool grouped_experts_supported(const torch::Tensor& hidden, const torch::Tensor& gate,
                               const torch::Tensor& up, const torch::Tensor& down);

}  // namespace mixtrain
