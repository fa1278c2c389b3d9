// A MoE layer's routed experts on one rank (every expert local): the SwiGLU MLP of expert e,
// down_e(silu(gate_e x) * up_e x), applied to the tokens routed to it and weighted by their
// routing weight; each token's top-k outputs summed. Two forms:
//   loop     the (token, slot) rows sorted by expert (stable), then per expert: its rows
//            gathered, its three GEMMs, weighted, index_add_ into the output. The host reads
//            the tokens per expert to size each GEMM (core/host_sync.h: one read per call).
//            The CPU form: its bits are the ones every CPU test and checkpoint knows. Each
//            expert's GEMMs run on the rows expert_mlp (below) pads to, the padding rows
//            repeating the expert's first row (their gradients are zeros).
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

// The rows one expert's GEMMs run on for `rows` routed rows (the row count padded to by
// expert_mlp): rounded up to a multiple of kExpertRowStep and of 1/8 of the largest power of
// two <= rows (at most 12.5% more work above 256 rows; a few shapes per octave).
inline constexpr int64_t kExpertRowStep = 32;
int64_t expert_gemm_rows(int64_t rows);

// ATen's bfloat16 GEMM on the CPU runs on oneDNN when rows * K * N > 16^3 and on its own kernel
// below (aten/src/ATen/native/mkldnn/Matmul.cpp, `checksize`); the two sum in different orders.
inline constexpr int64_t kOneDnnMinGemmSize = 16 * 16 * 16;

// One expert's SwiGLU MLP on its rows: x [n, H], gate and up [I, H], down [H, I] ->
// down(silu(gate x) * up x), [n, H]. On the CPU in bfloat16, when oneDNN runs the GEMMs
// (n * H * I > kOneDnnMinGemmSize), x is zero-padded to expert_gemm_rows(n) rows for them and the
// result cut back to n rows. Why: oneDNN builds and caches a kernel per GEMM shape, and routed
// row counts change every step, so unpadded a small MoE kept building kernels for tens of steps
// (its step took up to 2x its steady time) and its cache kept missing after. Why it changes no
// bit: oneDNN's result for a row does not depend on the row count, and the zero rows add exact
// zeros to the weight gradients (tests/unit/model/routed_experts_test.cpp checks both, forward and
// every gradient, 1, 2 and 4 threads, on both sides of the threshold); padding never moves a GEMM
// from ATen's kernel to oneDNN, whose sums differ. Elsewhere (CUDA, float32, and bf16 on the
// widened path of core/cpu_gemm.h, a float32 GEMM) the rows run as they are.
torch::Tensor expert_mlp(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                         const torch::Tensor& down);
// The rows expert_mlp runs `rows` routed rows of x's dtype and device on, for an expert whose
// gate is `gate` ([I, H]): expert_gemm_rows(rows) where oneDNN runs the GEMMs, else `rows`.
int64_t padded_expert_rows(int64_t rows, const torch::Tensor& x, const torch::Tensor& gate);

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
