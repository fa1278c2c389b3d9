// CUDA::sum_of_squares (optim/kernels/sum_of_squares_kernel.h) and global_grad_norm on CUDA
// tensors (optim/grad_clip.h): against an independent double sum and against the CPU kernel,
// each with the tolerance its rounding allows; bit-identical from run to run; many buffers of
// mixed dtypes (more than one launch takes), empty buffers, none.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/optim/grad_clip.h"
#include "mixtrain/optim/kernels/sum_of_squares_kernel.h"
#include "mixtrain/optim/sum_of_squares_fused.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

// Squares of float values are exact in double (48 significant bits); summing n of them in
// order rounds n times: relative error <= n * 2^-53 (all terms are >= 0).
double double_sum_of_squares(const std::vector<at::Tensor>& tensors, int64_t* terms) {
  double sum = 0.0;
  *terms = 0;
  for (const auto& t : tensors) {
    const at::Tensor f = t.to(at::kFloat).contiguous().cpu();
    for (int64_t i = 0; i < f.numel(); ++i) {
      const double x = f.data_ptr<float>()[i];
      sum += x * x;
    }
    *terms += f.numel();
  }
  return sum;
}

// 150 buffers (a launch takes 128) of float32, bfloat16 and float16, sizes with tails, some
// empty, one spanning many chunks.
std::vector<at::Tensor> mixed_buffers() {
  const at::ScalarType dtypes[] = {at::kFloat, at::kBFloat16, at::kHalf};
  std::vector<at::Tensor> out;
  for (int i = 0; i < 150; ++i) {
    const int64_t n = i % 17 == 3 ? 0 : (i * 7919) % 5003 + 1;
    out.push_back((at::randn({n}) * (1 + i % 5)).to(dtypes[i % 3]).to(at::kCUDA));
  }
  out.push_back(at::randn({(int64_t{1} << 20) + 77}).to(at::kCUDA));  // 65 chunks
  return out;
}

double device_sum(const std::vector<at::Tensor>& tensors) {
  const at::Tensor sum = sum_of_squares_fused(tensors, at::Device(at::kCUDA, 0));
  EXPECT_EQ(sum.scalar_type(), at::kDouble);
  EXPECT_TRUE(sum.is_cuda());
  EXPECT_EQ(sum.dim(), 0);
  return sum.item<double>();
}

TEST(SumOfSquaresCuda, MatchesADoubleSumAndRepeatsBitwise) {
  at::manual_seed(31);
  const std::vector<at::Tensor> buffers = mixed_buffers();
  int64_t terms = 0;
  const double expected = double_sum_of_squares(buffers, &terms);
  const double got = device_sum(buffers);
  // Both are sums of exact squares in double: the reference rounds `terms` times in sequence;
  // the kernel rounds at most 64 times per thread (16384 / 256 elements), 8 times in each block's
  // tree, partials / 256 + 8 times in the final block: far fewer than `terms`. So the two are
  // within 2 * terms * 2^-53 of each other, relative.
  EXPECT_LE(std::fabs(got - expected), 2.0 * static_cast<double>(terms) * 0x1p-53 * expected);
  // Fixed order, no atomics: the same bits every time.
  for (int run = 0; run < 3; ++run) {
    const double again = device_sum(buffers);
    EXPECT_EQ(std::memcmp(&again, &got, sizeof(double)), 0);
  }
}

TEST(SumOfSquaresCuda, AgreesWithTheCpuKernelWithinItsFloatRounding) {
  at::manual_seed(32);
  const std::vector<at::Tensor> buffers = mixed_buffers();
  std::vector<at::Tensor> on_cpu;
  for (const auto& t : buffers) on_cpu.push_back(t.cpu());
  // The CPU kernel sums squares in float32 lanes (different order, float accumulation): a lane
  // adds at most 4096 / (4 * 8) = 128 squares per block and up to 4095 / 8 < 512 in a chunk's
  // tail loop, each with at most two roundings (DEFAULT's multiply then add) of 2^-24 relative:
  // relative error <= 2 * 512 * 2^-24 = 2^-14 (all terms >= 0). The device sum is exact to
  // ~1e-12 (previous test), so 2^-14 relative bounds their difference.
  const double cpu = global_grad_norm(on_cpu);
  const double gpu = global_grad_norm(buffers);
  // Norms: the square root halves a relative difference of the sums.
  EXPECT_LE(std::fabs(gpu - cpu), 0x1p-15 * cpu);
  EXPECT_GT(cpu, 0.0);
}

TEST(SumOfSquaresCuda, EmptyListsAndEmptyBuffersGiveZero) {
  EXPECT_EQ(device_sum({}), 0.0);
  EXPECT_EQ(device_sum({at::empty({0}, at::TensorOptions().device(at::kCUDA)),
                        at::empty({0}, at::TensorOptions().device(at::kCUDA).dtype(at::kHalf))}),
            0.0);
  EXPECT_EQ(global_grad_norm(
                std::vector<at::Tensor>{at::zeros({1000}, at::TensorOptions().device(at::kCUDA))}),
            0.0);
}

TEST(SumOfSquaresCuda, KnownValues) {
  // 1^2 + ... + n^2 = n (n + 1) (2n + 1) / 6, every partial sum exact in double for n = 50000.
  const int64_t n = 50000;
  const at::Tensor t = at::arange(1, n + 1, at::kFloat).to(at::kCUDA);
  const double expected = static_cast<double>(n) * (n + 1) * (2 * n + 1) / 6;
  EXPECT_EQ(device_sum({t}), expected);
  EXPECT_EQ(sum_of_squares(t), expected);  // grad_clip's entry, through the CUDA pass
}

TEST(SumOfSquaresCuda, RejectsOtherDtypes) {
  const at::Tensor d = at::ones({4}, at::TensorOptions().device(at::kCUDA).dtype(at::kDouble));
  EXPECT_THROW(sum_of_squares_fused({d}, d.device()), c10::Error);
  // grad_clip sums such tensors through ATen in double instead.
  EXPECT_EQ(sum_of_squares(d), 4.0);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
