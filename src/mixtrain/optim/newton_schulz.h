// Newton–Schulz orthogonalization for Muon (docs/architecture.md §5), as pure functions so the
// single-process Muon and the distributed Muon paths (FSDP all_to_all, DDP all_gather,
// expert-local) share them.
//
// For a matrix G = U S V^T, Muon wants U V^T (all singular values set to 1). Newton–Schulz gets
// close with matrix products only: X_0 = G / (||G||_F + eps) puts every singular value in
// [0, 1], and each step X <- a X + b (X X^T) X + c (X X^T)^2 X maps every singular value s to
// p(s) = a s + b s^3 + c s^5 while keeping U and V. The coefficient schedule decides how fast
// small singular values grow and the band the results end in (legacy: about [0.68, 1.13]).
// polar_express (Amsel, Persson, Musco, Gower, arXiv 2505.16932) also divides the norm by
// (1 + safety): X_0 = G / (||G||_F (1 + safety) + eps), so round-off that pushes a singular
// value past 1 stays inside the interval its polynomials were designed for.
// The products are computed on the short side (X is transposed when rows > cols), so
// X X^T is min(rows, cols) square.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain {

using NsCoefficients = std::array<double, 3>;  // (a, b, c)

// ns_variant hybrid: the legacy coefficients for this many steps, then (2.0, -1.5, 0.5).
constexpr int64_t kHybridLegacySteps = 8;

// One (a, b, c) per Newton–Schulz step:
//   legacy: (3.4445, -4.7750, 2.0315) every step;
//   asym5:  the five triples of docs/architecture.md §5, the first ns_steps of them (ns_steps > 5
//   throws:
//           "asym5 has 5 coefficient sets; muon_ns_steps=N", never a silent cut);
//   quintic: asym5 under the name Emerging-Optimizers / Megatron use for these five triples;
//   hybrid: legacy for steps 0..7, then (2.0, -1.5, 0.5);
//   polar_express: the published set of exactly ns_steps triples, 5 or 8 (anything else throws
//           "polar_express has published 5-step and 8-step sets; muon_ns_steps=N"):
//           8: the paper's Algorithm 1 (l = 1e-3, cushion 0.0241), each triple but the last
//              divided by (1.01, 1.01^3, 1.01^5) as the paper's code does: p(x) -> p(x / 1.01);
//           5: the set designed for 5 steps (l = 1e-3, cushion 0.02, safety 1.02 folded into all
//              but the last triple), as modded-nanogpt, nanochat and Dion ship it.
//           Sources compared (newton_schulz.cpp): the paper's text and repository, Emerging-
//           Optimizers, modded-nanogpt/Dion, and our own re-derivation of both sets;
//   custom: `custom` itself; its length must equal ns_steps.
// Throws std::invalid_argument for an unknown variant, ns_steps < 1 or a custom length mismatch.
std::vector<NsCoefficients> newton_schulz_schedule(const std::string& variant, int64_t ns_steps,
                                                   const std::vector<NsCoefficients>& custom = {});

// The factor (1 + safety) newton_schulz() multiplies the input's norm by: polar_express 1.01 with
// 8 steps, 1.02 with 5 (the safety its triples were computed for); 1 for every other variant.
// Throws as newton_schulz_schedule() does for polar_express with another step count.
double newton_schulz_norm_scale(const std::string& variant, int64_t ns_steps);

// Orthogonalizes the last two dims of g ([..., A, B]; leading dims are a batch of independent
// matrices) in compute_dtype (bfloat16, float32 or float64): transpose if A > B;
// X = X / (||X||_F * norm_scale + eps) per matrix (norm_scale 1: no multiply at all); per schedule
// entry A = X X^T, X = a X + (b A + c A A) X;
// transpose back. Returns a new tensor in compute_dtype with g's shape. g is not modified.
// Throws std::invalid_argument for g.dim() < 2 or another compute dtype.
at::Tensor newton_schulz(const at::Tensor& g, const std::vector<NsCoefficients>& schedule,
                         double eps, c10::ScalarType compute_dtype = c10::ScalarType::BFloat16,
                         double norm_scale = 1.0);

// A batch is orthogonalized in calls of at most this many bytes of X per call (at least one
// matrix), each call's temporaries (X, X X^T, the polynomial: about 3x this) reused through
// the heap. Why: one call on a large stack (Muon batches every same-shape matrix of a group)
// allocated ~40 MiB temporaries, which glibc maps fresh and returns at every free, so every
// Newton-Schulz step first-touched them again: 4x the GEMM time on a 2-core VM where a page
// fault costs ~13 us (bench/README.md, train_throughput). Results are unchanged: the matrices
// are independent and each one's GEMMs are the same.
constexpr int64_t kNewtonSchulzBytesPerCall = int64_t{8} << 20;
// On a CUDA device: the caching allocator keeps freed blocks, so there is no first touch to
// avoid, and the larger a batched GEMM the fuller the GPU; the cap only bounds the temporaries
// (~3 GiB) on a device of tens of GiB. A 4096x4096 bf16 matrix is 32 MiB: 32 per call. On a GPU
// the batch count may change cuBLAS's algorithm choice, so there a different cut may change the
// rounding of the GEMMs (on the CPU it does not).
constexpr int64_t kNewtonSchulzBytesPerCallCuda = int64_t{1} << 30;
// How many rows x cols matrices newton_schulz() orthogonalizes per call in dtype on a device of
// `device` type (the CUDA cap for CUDA, the CPU one for anything else).
int64_t newton_schulz_matrices_per_call(int64_t rows, int64_t cols, c10::ScalarType dtype,
                                        c10::DeviceType device = c10::DeviceType::CPU);

}  // namespace mixtrain
