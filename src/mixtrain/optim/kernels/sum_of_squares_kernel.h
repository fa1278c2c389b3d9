// Sum of squares of a contiguous floating buffer: the per-capability kernel variants.
//
// sum_of_squares_kernel.cpp is compiled once per capability (docs/architecture.md §1), defining
// these functions in namespace DEFAULT, AVX2 and AVX512; callers dispatch with select_kernel()
// (core/cpu_capability.h). Call an AVX2/AVX512 variant only when the CPU supports it.
//
// Contract of sum_of_squares(buffers, count): the sum, over all buffers, of the squares of
// their elements. Each buffer is contiguous float32, bfloat16 or float16 (anything else with
// numel > 0 throws std::invalid_argument); squares are accumulated in float32 vectors (16-bit
// values converted to float on load) and reduced in double every few thousand elements. Every
// buffer is cut into fixed chunks of kSumOfSquaresChunk elements, all chunks of all buffers go
// through one at::parallel_for, and the chunk sums are added in list order, so the result is
// bit-identical for any thread count (it may differ between capabilities in the last bits:
// different lane grouping).
//
// CUDA::sum_of_squares (sum_of_squares_kernel.cu) is the device twin: each square is exact in
// double (a float's square needs 48 of double's 53 bits) and accumulated in double, in an order
// fixed by the buffer list and the constants below only (no atomics): bit-identical from run to
// run. It differs from the CPU variants in the summation order and in accumulating in double
// (theirs sums float32 lanes), so the two agree to the CPU's float32 rounding error, not bitwise.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace mixtrain {

constexpr int64_t kSumOfSquaresChunk = int64_t{1} << 16;

struct SquaresBuffer {
  const void* data;
  int64_t numel;
  c10::ScalarType dtype;
};

namespace DEFAULT {
double sum_of_squares(const SquaresBuffer* buffers, int64_t count);
int64_t float_vector_size();  // at::vec::Vectorized<float>::size() in this build
}  // namespace DEFAULT
namespace AVX2 {
double sum_of_squares(const SquaresBuffer* buffers, int64_t count);
int64_t float_vector_size();
}  // namespace AVX2
namespace AVX512 {
double sum_of_squares(const SquaresBuffer* buffers, int64_t count);
int64_t float_vector_size();
}  // namespace AVX512

namespace CUDA {
// Elements per block of the first pass; each block writes one partial sum.
constexpr int64_t kSumOfSquaresCudaChunk = int64_t{1} << 14;
// How many partial sums sum_of_squares needs for these buffers (the workspace's length).
int64_t sum_of_squares_partials(const SquaresBuffer* buffers, int64_t count);
// Enqueues on `stream` (a cudaStream_t of the buffers' device, the current device) the sum of
// squares of the device buffers, written as one double to *out (device memory); `partials` is
// device workspace of sum_of_squares_partials(...) doubles. Returns without waiting. Chunk sums
// go to partials in list order; one block then adds them in a fixed order. No buffers (or only
// empty ones): *out = 0. Throws std::invalid_argument for another dtype with numel > 0,
// std::runtime_error when a launch fails.
void sum_of_squares(const SquaresBuffer* buffers, int64_t count, double* partials, double* out,
                    void* stream);
}  // namespace CUDA

}  // namespace mixtrain
