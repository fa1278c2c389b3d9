// CUDA twin of sum_of_squares_kernel.cpp (contract in sum_of_squares_kernel.h).
//
// Pass 1, one launch per kSquaresLaunch buffers (the buffer table is a kernel argument): block b
// takes chunk b of the launch (kSumOfSquaresCudaChunk elements of one buffer); thread k adds the
// squares of elements k, k + kThreads, ... of the chunk in that order, in double; the block adds
// its threads' sums by a fixed tree; partials[chunk] = the block's sum. Pass 2, one block: thread
// k adds partials k, k + kThreads, ... in order, then the same tree. Every addition is fixed by
// the buffers and these constants, never by scheduling: no atomics.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "mixtrain/optim/kernels/multi_tensor_chunk.cuh"
#include "mixtrain/optim/kernels/sum_of_squares_kernel.h"

namespace mixtrain {
namespace CUDA {
namespace {

constexpr int kThreads = 256;
constexpr int kSquaresLaunch = 128;

enum Kind : uint8_t { kFloat = 0, kBFloat16 = 1, kHalf = 2 };

struct Table {
  const void* data[kSquaresLaunch];
  int64_t numel[kSquaresLaunch];
  int first_chunk[kSquaresLaunch + 1];
  uint8_t kind[kSquaresLaunch];
  int count;
  int64_t partial_base;  // partials index of this launch's first chunk
};
static_assert(sizeof(Table) <= 4096, "the table must fit the 4 KiB kernel-argument limit");

// The element widened exactly to double (via float, as the CPU kernel loads it).
__device__ __forceinline__ double widened(const void* data, uint8_t kind, int64_t i) {
  if (kind == kBFloat16) {
    const uint32_t bits = static_cast<const uint16_t*>(data)[i];
    return static_cast<double>(__uint_as_float(bits << 16));
  }
  if (kind == kHalf) return static_cast<double>(__half2float(static_cast<const __half*>(data)[i]));
  return static_cast<double>(static_cast<const float*>(data)[i]);
}

// Adds the kThreads values of `sums` (shared) by a fixed tree; thread 0 gets the total, the
// others 0: thread 0 writes sums[0] last, so another thread reading it would race (no barrier
// follows that write).
__device__ double block_sum(double* sums) {
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < stride) {
      sums[threadIdx.x] = __dadd_rn(sums[threadIdx.x], sums[threadIdx.x + stride]);
    }
  }
  return threadIdx.x == 0 ? sums[0] : 0.0;
}

__global__ void __launch_bounds__(kThreads) chunk_sums(const Table table, double* partials) {
  __shared__ double sums[kThreads];
  const int chunk = static_cast<int>(blockIdx.x);
  const int t = tensor_of_chunk(table.first_chunk, table.count, chunk);
  const int64_t begin = static_cast<int64_t>(chunk - table.first_chunk[t]) * kSumOfSquaresCudaChunk;
  const int64_t rest = table.numel[t] - begin;
  const int64_t end = begin + (rest < kSumOfSquaresCudaChunk ? rest : kSumOfSquaresCudaChunk);
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const double x = widened(table.data[t], table.kind[t], i);
    acc = __fma_rn(x, x, acc);  // x * x is exact in double
  }
  sums[threadIdx.x] = acc;
  const double total = block_sum(sums);
  if (threadIdx.x == 0) partials[table.partial_base + chunk] = total;
}

__global__ void __launch_bounds__(kThreads)
    total_sum(const double* partials, int64_t n, double* out) {
  __shared__ double sums[kThreads];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) acc = __dadd_rn(acc, partials[i]);
  sums[threadIdx.x] = acc;
  const double total = block_sum(sums);
  if (threadIdx.x == 0) *out = total;
}

void check_launch() {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("sum_of_squares (CUDA): launch failed: ") +
                             cudaGetErrorString(status));
  }
}

int64_t chunks_of(const SquaresBuffer& b) {
  return (b.numel + kSumOfSquaresCudaChunk - 1) / kSumOfSquaresCudaChunk;
}

}  // namespace

int64_t sum_of_squares_partials(const SquaresBuffer* buffers, int64_t count) {
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (buffers[i].numel > 0) total += chunks_of(buffers[i]);
  }
  return total;
}

void sum_of_squares(const SquaresBuffer* buffers, int64_t count, double* partials, double* out,
                    void* stream) {
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  constexpr int64_t kMaxChunks = 0x7fffffff;  // the grid's x limit
  Table table;
  std::memset(&table, 0, sizeof(table));
  const auto launch = [&] {
    if (table.count == 0) return;
    chunk_sums<<<table.first_chunk[table.count], kThreads, 0, cuda_stream>>>(table, partials);
    check_launch();
  };
  int64_t partial_end = 0;
  for (int64_t i = 0; i < count; ++i) {
    const SquaresBuffer& b = buffers[i];
    if (b.numel < 0) throw std::invalid_argument("sum_of_squares (CUDA): negative numel");
    if (b.numel == 0) continue;
    uint8_t kind = kFloat;
    if (b.dtype == c10::ScalarType::BFloat16) {
      kind = kBFloat16;
    } else if (b.dtype == c10::ScalarType::Half) {
      kind = kHalf;
    } else if (b.dtype != c10::ScalarType::Float) {
      throw std::invalid_argument(
          "sum_of_squares (CUDA): dtype must be float32, bfloat16 or float16");
    }
    const int64_t chunks = chunks_of(b);
    if (chunks > kMaxChunks) throw std::invalid_argument("sum_of_squares (CUDA): buffer too large");
    if (table.count == kSquaresLaunch || table.first_chunk[table.count] + chunks > kMaxChunks) {
      launch();
      std::memset(&table, 0, sizeof(table));
      table.partial_base = partial_end;
    }
    const int k = table.count++;
    table.data[k] = b.data;
    table.numel[k] = b.numel;
    table.kind[k] = kind;
    table.first_chunk[k + 1] = table.first_chunk[k] + static_cast<int>(chunks);
    partial_end += chunks;
  }
  launch();
  total_sum<<<1, kThreads, 0, cuda_stream>>>(partials, partial_end, out);
  check_launch();
}

}  // namespace CUDA
}  // namespace mixtrain
