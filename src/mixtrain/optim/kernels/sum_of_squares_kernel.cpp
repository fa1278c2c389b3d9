// Compiled three times (CPU_CAPABILITY = DEFAULT, AVX2, AVX512); see the header for the
// contract. Vectorized<float> is 16 lanes only because CMake defines CPU_CAPABILITY_AVX512
// for that build; in DEFAULT it is ATen's scalar emulation.
//
// Keep kernel files free of out-of-line inline code outside namespace CPU_CAPABILITY (c10
// string formatting such as TORCH_CHECK messages, iostreams): the linker keeps one copy of
// such a weak symbol for the whole program, and the AVX-512 copy would crash older CPUs.
// Hence plain std::invalid_argument with literal messages below.
#include "mixtrain/optim/kernels/sum_of_squares_kernel.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "mixtrain/optim/kernels/vec_float.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__) && !defined(__clang__)
// GCC 12 false positive: its AVX-512 intrinsics start from _mm512_undefined_epi32(), a
// deliberately self-initialised register, and -Wmaybe-uninitialized reports it wherever
// ATen's bf16 conversion is inlined into our code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace mixtrain {
namespace CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();
// Squares are summed in float32 lanes over a block, then the lanes are added in double: each
// lane then sums at most kBlock / (4 * kLanes) terms, which keeps the float32 rounding error
// near 1e-6 relative, while the double flush costs a few percent of the loop.
constexpr int64_t kBlock = 4096;
static_assert(kBlock % (4 * kLanes) == 0, "a block is whole unrolled vector groups");
static_assert(kSumOfSquaresChunk % kBlock == 0, "a chunk is whole blocks");

inline double lanes_to_double(const Vec& v) {
  float values[kLanes];
  v.store(values);
  double sum = 0.0;
  for (int64_t k = 0; k < kLanes; ++k) sum += values[k];
  return sum;
}

// One chunk (at most kSumOfSquaresChunk elements), always summed in the same order.
template <typename T>
double chunk_sum_of_squares(const T* p, int64_t n) {
  double total = 0.0;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    // Four independent accumulators hide the FMA latency.
    Vec a0(0.f), a1(0.f), a2(0.f), a3(0.f);
    for (int64_t j = i; j < i + kBlock; j += 4 * kLanes) {
      const Vec x0 = load_float(p + j);
      const Vec x1 = load_float(p + j + kLanes);
      const Vec x2 = load_float(p + j + 2 * kLanes);
      const Vec x3 = load_float(p + j + 3 * kLanes);
      a0 = at::vec::fmadd(x0, x0, a0);
      a1 = at::vec::fmadd(x1, x1, a1);
      a2 = at::vec::fmadd(x2, x2, a2);
      a3 = at::vec::fmadd(x3, x3, a3);
    }
    total +=
        (lanes_to_double(a0) + lanes_to_double(a1)) + (lanes_to_double(a2) + lanes_to_double(a3));
  }
  Vec acc(0.f);
  for (; i + kLanes <= n; i += kLanes) {
    const Vec x = load_float(p + i);
    acc = at::vec::fmadd(x, x, acc);
  }
  total += lanes_to_double(acc);
  for (; i < n; ++i) {
    const double x = static_cast<float>(p[i]);
    total += x * x;
  }
  return total;
}

double chunk_sum(const SquaresBuffer& buffer, int64_t offset, int64_t n) {
  switch (buffer.dtype) {
    case c10::ScalarType::Float:
      return chunk_sum_of_squares(static_cast<const float*>(buffer.data) + offset, n);
    case c10::ScalarType::BFloat16:
      return chunk_sum_of_squares(static_cast<const c10::BFloat16*>(buffer.data) + offset, n);
    case c10::ScalarType::Half:
      return chunk_sum_of_squares(static_cast<const c10::Half*>(buffer.data) + offset, n);
    default:
      break;
  }
  return 0.0;  // unreachable: dtypes are checked before the parallel region
}

}  // namespace

double sum_of_squares(const SquaresBuffer* buffers, int64_t count) {
  // Chunk c of the whole list is chunk (c - first_chunk[b]) of buffer b.
  std::vector<int64_t> first_chunk(static_cast<size_t>(count) + 1, 0);
  for (int64_t b = 0; b < count; ++b) {
    const SquaresBuffer& buffer = buffers[b];
    if (buffer.numel < 0) throw std::invalid_argument("sum_of_squares: negative numel");
    if (buffer.numel > 0 && buffer.dtype != c10::ScalarType::Float &&
        buffer.dtype != c10::ScalarType::BFloat16 && buffer.dtype != c10::ScalarType::Half) {
      throw std::invalid_argument("sum_of_squares: dtype must be float32, bfloat16 or float16");
    }
    first_chunk[b + 1] =
        first_chunk[b] + (buffer.numel + kSumOfSquaresChunk - 1) / kSumOfSquaresChunk;
  }
  const int64_t chunks = first_chunk[count];
  std::vector<double> partial(static_cast<size_t>(chunks));
  auto work = [&](int64_t begin, int64_t end) {
    int64_t b =
        std::upper_bound(first_chunk.begin(), first_chunk.end(), begin) - first_chunk.begin() - 1;
    for (int64_t c = begin; c < end; ++c) {
      while (c >= first_chunk[b + 1]) ++b;  // skips empty buffers too
      const int64_t offset = (c - first_chunk[b]) * kSumOfSquaresChunk;
      partial[static_cast<size_t>(c)] =
          chunk_sum(buffers[b], offset, std::min(kSumOfSquaresChunk, buffers[b].numel - offset));
    }
  };
  // One parallel region for the whole list: a model has hundreds of small gradients, and a
  // fork/join per tensor would cost more than the arithmetic.
  if (chunks > 1) {
    at::parallel_for(0, chunks, 1, work);
  } else {
    work(0, chunks);
  }
  // Chunk order, independent of which thread computed which chunk.
  double total = 0.0;
  for (const double v : partial) total += v;
  return total;
}

int64_t float_vector_size() {
  return kLanes;
}

}  // namespace CPU_CAPABILITY
}  // namespace mixtrain
