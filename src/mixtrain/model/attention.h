// Causal grouped-query self-attention (the core of Qwen2-MoE's attention, after the projections
// and rotary embeddings), with two of LibTorch's implementations (on the CPU as below; on CUDA
// kFlash is SDPA's fused kernels, see attention_kernel_for):
//   q [B, Hq, S, D], k and v [B, Hkv, S, D], Hq a multiple of Hkv; query head h reads kv head
//   h / (Hq / Hkv) (HF repeat_kv); position i attends to keys 0..i with weights
//   softmax_j(q_i . k_j / sqrt(D)); -> [B, Hq, S, D] in q's dtype, differentiable in q, k, v.
// Kernels:
//   kMath:  HF's eager attention as tensor ops: k, v repeated per group; Q K^T and its scaling
//           in the compute dtype, masked, softmax upcast to float32, P cast back, P V.
//   kFlash: at::scaled_dot_product_attention (is_causal, enable_gqa), which LibTorch 2.x runs as
//           its CPU flash-attention kernel: scores, softmax and both GEMMs' accumulations in
//           float32, P rounded to the compute dtype only as an operand of the second GEMM.
// The model runs attention_kernel_for(its compute dtype), through attention_on_gemm_path (bf16
// and fp16 on a CPU without their arithmetic: kFlash in float32); the measurements behind that are
// in bench/README.md (attention_bench), the accuracy of both against a float64 reference in
// tests/unit/model/attention_test.cpp. Both give the same bits for a sequence alone or inside a
// batch, and for any number of intra-op threads, except kMath in float32 (MKL's sgemm splits the
// backward's sums by thread count).
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>

namespace mixtrain {

enum class AttentionKernel { kMath, kFlash };

const char* attention_kernel_name(AttentionKernel kernel);  // "math", "flash"

// The model's kernel. On the CPU: kFlash for float32 (forward + backward 1.4-2.3x faster on this
// CPU, as accurate), kMath for bfloat16 and float16 (flash's backward makes forward + backward
// up to 3.1x slower there). On a CUDA device: kFlash for every dtype, where
// at::scaled_dot_product_attention runs LibTorch's fused kernels (flash, cuDNN or
// memory-efficient, LibTorch's pick for the shape and dtype: float32 accumulation, no [S, S]
// matrix in memory); attention_cuda_test checks it against the math path and a float64
// reference.
AttentionKernel attention_kernel_for(c10::ScalarType dtype, c10::Device device = c10::kCPU);

// How the model's attention layers call their kernel: `attend(q, k, v, kernel)` with
// attention_kernel_for(q's dtype), except where q's bf16/fp16 GEMMs take the widened path of
// core/cpu_gemm.h (a CPU without bf16/fp16 arithmetic): there q, k and v are widened to float32,
// attention runs as the float32 model's (kFlash: scores, softmax and both products in float32)
// and its output is rounded once to q's dtype. `attend` is the layer's own call (local or
// context-parallel), so both run the same numerics.
using AttendFn = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&,
                                             const torch::Tensor&, AttentionKernel)>;
torch::Tensor attention_on_gemm_path(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const AttendFn& attend);

// window > 0: sliding-window causal attention (HF Mistral's sliding_window): position i attends
// to keys max(0, i - window + 1)..i, window keys including itself; kFlash then passes the band
// as SDPA's boolean mask. 0: every earlier key.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, AttentionKernel kernel, int64_t window = 0);

// QK-clip's statistic (Kimi K2, arXiv 2507.20534): per query head h, the max over the batch and
// over every (query i, key j) pair the causal mask lets through of the scaled logit
// q_i . k_j / sqrt(D), computed in float32 without autograd. q [B, Hq, Sq, D], k [B, Hkv, Sk, D]
// (query head h reads kv head h / (Hq / Hkv)); q_positions int64 [Sq] and k_positions [Sk] are
// the tokens' positions (pair allowed when k_pos <= q_pos); undefined: both 0..S-1 (Sq == Sk).
// -> float32 [Hq] on q's device. The scores are formed in blocks of query rows (at most 2^24
// floats at a time), so the memory is bounded whatever the sequence length; the cost is one
// extra Q K^T per forward.
// window > 0: only the pairs sliding-window attention lets through (k_pos > q_pos - window).
torch::Tensor causal_max_logits(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& q_positions = {},
                                const torch::Tensor& k_positions = {}, int64_t window = 0);

// Grouped-query attention: [B, Hkv, S, D] -> [B, Hkv * n_rep, S, D], query head h reads kv head
// h / n_rep (HF repeat_kv, = repeat_interleave on dim 1).
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t n_rep);

}  // namespace mixtrain
