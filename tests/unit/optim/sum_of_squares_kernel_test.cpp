// The per-capability kernel variants: each variant the CPU supports agrees with an
// independent double-precision sum and with DEFAULT; the vector builds really are 8/16
// floats wide; the result does not depend on the thread count.
//
// Tolerance: squares are rounded to float32 and each float32 lane sums at most 64 of them
// before the double flush (kernel header), so the relative error is below 64 * 2^-24 ~ 4e-6
// even in the worst case (all terms positive). We allow 1e-5 against the exact reference and
// between variants.
#include "mixtrain/optim/kernels/sum_of_squares_kernel.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "mixtrain/core/cpu_capability.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using Kernel = double (*)(const SquaresBuffer*, int64_t);
constexpr double kRelTol = 1e-5;

// One buffer through a kernel variant.
double run(Kernel kernel, const void* data, int64_t numel, c10::ScalarType dtype) {
  const SquaresBuffer buffer{data, numel, dtype};
  return kernel(&buffer, 1);
}

struct Variant {
  CpuCapability capability;
  Kernel kernel;
  int64_t (*width)();
};

// The variants this CPU can run.
std::vector<Variant> supported_variants() {
  std::vector<Variant> all = {
      {CpuCapability::kDefault, DEFAULT::sum_of_squares, DEFAULT::float_vector_size},
      {CpuCapability::kAvx2, AVX2::sum_of_squares, AVX2::float_vector_size},
      {CpuCapability::kAvx512, AVX512::sum_of_squares, AVX512::float_vector_size}};
  std::vector<Variant> supported;
  for (const auto& v : all) {
    if (v.capability <= hardware_cpu_capability()) supported.push_back(v);
  }
  return supported;
}

// Sum of squares in double from the stored values, element by element.
double reference(const at::Tensor& t) {
  const at::Tensor as_float = t.to(at::kFloat).contiguous();  // exact for bf16/fp16
  const float* p = as_float.data_ptr<float>();
  double sum = 0.0;
  for (int64_t i = 0; i < as_float.numel(); ++i) sum += static_cast<double>(p[i]) * p[i];
  return sum;
}

TEST(SumOfSquaresKernelTest, VectorBuildsHaveTheirWidth) {
  for (const auto& v : supported_variants()) {
    switch (v.capability) {
      case CpuCapability::kAvx512:
        EXPECT_EQ(v.width(), 16)
            << "AVX512 build is not 512 bits wide: CPU_CAPABILITY_AVX512 missing?";
        break;
      case CpuCapability::kAvx2:
        EXPECT_EQ(v.width(), 8);
        break;
      case CpuCapability::kDefault:
        EXPECT_EQ(v.width(), 8);  // ATen's scalar emulation of a 256-bit vector
        break;
    }
  }
}

TEST(SumOfSquaresKernelTest, SmallIntegersAreExactInEveryVariant) {
  // 1^2 + ... + 200^2 = 200 * 201 * 401 / 6 = 2686700: every partial sum is an integer below
  // 2^24, so float32 accumulation is exact whatever the lane grouping.
  const at::Tensor t = at::arange(1, 201, at::kFloat);
  for (const auto& v : supported_variants()) {
    EXPECT_EQ(run(v.kernel, t.data_ptr(), t.numel(), at::kFloat), 2686700.0)
        << cpu_capability_name(v.capability);
  }
}

TEST(SumOfSquaresKernelTest, VariantsAgreeWithReferenceAndDefaultForAllDtypesAndOddSizes) {
  at::manual_seed(7);
  // Around the vector widths, the 4096-element block and the 65536-element chunk.
  for (int64_t n : {1, 7, 8, 15, 17, 63, 65, 4095, 4097, 65535, 65537, 300001}) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const at::Tensor t = at::randn({n}).to(dtype);
      const double expected = reference(t);
      const double base = run(DEFAULT::sum_of_squares, t.data_ptr(), n, dtype);
      for (const auto& v : supported_variants()) {
        const double got = run(v.kernel, t.data_ptr(), n, dtype);
        EXPECT_NEAR(got, expected, kRelTol * expected)
            << "n=" << n << " dtype=" << dtype << " " << cpu_capability_name(v.capability);
        EXPECT_NEAR(got, base, kRelTol * expected)
            << "n=" << n << " dtype=" << dtype << " " << cpu_capability_name(v.capability);
      }
    }
  }
}

TEST(SumOfSquaresKernelTest, ResultIsBitIdenticalForAnyThreadCount) {
  at::manual_seed(3);
  const int64_t n = 10 * kSumOfSquaresChunk + 123;
  const at::Tensor t = at::randn({n});
  const int threads_before = at::get_num_threads();
  for (const auto& v : supported_variants()) {
    at::set_num_threads(1);
    const double one = run(v.kernel, t.data_ptr(), n, at::kFloat);
    for (int threads : {2, 3, 4}) {
      at::set_num_threads(threads);
      EXPECT_EQ(run(v.kernel, t.data_ptr(), n, at::kFloat), one)
          << threads << " threads, " << cpu_capability_name(v.capability);
    }
  }
  at::set_num_threads(threads_before);
}

TEST(SumOfSquaresKernelTest, ManyBuffersInOneCallSumAllOfThem) {
  // Mixed dtypes, empty buffers between others, sizes that split into several chunks: the
  // chunk-to-buffer mapping must visit every element exactly once.
  at::manual_seed(4);
  const std::vector<at::Tensor> tensors = {
      at::randn({5}),
      at::empty({0}),
      at::randn({2 * kSumOfSquaresChunk + 9}).to(at::kBFloat16),
      at::empty({0}, at::kHalf),
      at::randn({kSumOfSquaresChunk}).to(at::kHalf),
      at::randn({3})};
  std::vector<SquaresBuffer> buffers;
  double expected = 0.0;
  for (const auto& t : tensors) {
    buffers.push_back({t.data_ptr(), t.numel(), t.scalar_type()});
    expected += reference(t);
  }
  const int threads_before = at::get_num_threads();
  for (const auto& v : supported_variants()) {
    at::set_num_threads(1);
    const double one = v.kernel(buffers.data(), static_cast<int64_t>(buffers.size()));
    EXPECT_NEAR(one, expected, kRelTol * expected) << cpu_capability_name(v.capability);
    at::set_num_threads(2);
    EXPECT_EQ(v.kernel(buffers.data(), static_cast<int64_t>(buffers.size())), one);
  }
  at::set_num_threads(threads_before);
}

TEST(SumOfSquaresKernelTest, EmptyBufferIsZeroAndOtherDtypesAreRejected) {
  EXPECT_EQ(run(DEFAULT::sum_of_squares, nullptr, 0, at::kFloat), 0.0);
  EXPECT_EQ(DEFAULT::sum_of_squares(nullptr, 0), 0.0);
  const at::Tensor d = at::ones({4}, at::kDouble);
  EXPECT_THROW(run(DEFAULT::sum_of_squares, d.data_ptr(), 4, at::kDouble), std::invalid_argument);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
