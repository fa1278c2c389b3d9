// Newton–Schulz orthogonalization for Muon (docs/architecture.md §5), as pure functions so the
// single-process Muon and the distributed Muon paths (FSDP all_to_all, DDP all_gather,
// expert-local) share them.
//
// For a matrix G = U S V^T, Muon wants U V^T (all singular values set to 1). Newton–Schulz gets
// close with matrix products only: X_0 = G / (||G||_F + eps) puts every singular value in
// [0, 1], and each step X <- a X + b (X X^T) X + c (X X^T)^2 X maps every singular value s to
// p(s) = a s + b s^3 + c s^5 while keeping U and V. The coefficient schedule decides how fast
// small singular values grow and the band the results end in (legacy: about [0.68, 1.13]).
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

// One (a, b, c) per Newton–Schulz step:
//   legacy: (3.4445, -4.7750, 2.0315) every step;
//   asym5:  the five triples of docs/architecture.md §5, the first ns_steps of them (ns_steps > 5
//   throws:
//           "asym5 has 5 coefficient sets; muon_ns_steps=N", never a silent cut);
//   hybrid: legacy for steps 0..7, then (2.0, -1.5, 0.5);
//   custom: `custom` itself; its length must equal ns_steps.
// Throws std::invalid_argument for an unknown variant, ns_steps < 1 or a custom length mismatch.
std::vector<NsCoefficients> newton_schulz_schedule(const std::string& variant, int64_t ns_steps,
                                                   const std::vector<NsCoefficients>& custom = {});

// Orthogonalizes the last two dims of g ([..., A, B]; leading dims are a batch of independent
// matrices) in compute_dtype (bfloat16, float32 or float64): transpose if A > B;
// X = X / (||X||_F + eps) per matrix; per schedule entry A = X X^T, X = a X + (b A + c A A) X;
// transpose back. Returns a new tensor in compute_dtype with g's shape. g is not modified.
// Throws std::invalid_argument for g.dim() < 2 or another compute dtype.
at::Tensor newton_schulz(const at::Tensor& g, const std::vector<NsCoefficients>& schedule,
                         double eps, c10::ScalarType compute_dtype = c10::ScalarType::BFloat16);

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
