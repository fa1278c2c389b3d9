// CUDA::widen_add (optim/kernels/widen_add_kernel.h) through widen_add_fused
// (optim/widen_add_fused.h): bitwise what the CPU's dst.add_(src) and zeros + src give (one
// float addition after an exact widening), for bfloat16 and float16 sources with -0, subnormals
// and infinities, lengths with tails and more elements than the grid covers in one round.
// NaN inputs are checked for NaN only: a GPU returns its canonical NaN, x86 the input's payload.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "mixtrain/optim/widen_add_fused.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ca = a.contiguous().cpu(), cb = b.contiguous().cpu();
  return ca.sizes() == cb.sizes() && std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// Random values of the dtype with -0, the smallest subnormal, +inf and -inf spread through.
at::Tensor source(int64_t n, at::ScalarType dtype) {
  at::Tensor t = (at::randn({n}) * 3).to(dtype);
  const int16_t specials[] = {
      static_cast<int16_t>(0x8000), 0x0001,
      dtype == at::kBFloat16 ? int16_t{0x7F80} : int16_t{0x7C00},
      dtype == at::kBFloat16 ? static_cast<int16_t>(0xFF80) : static_cast<int16_t>(0xFC00)};
  at::Tensor bits = t.view(at::kShort);
  for (int64_t i = 0; i < n; i += 7) bits[i] = specials[(i / 7) % 4];
  return t;
}

TEST(WidenAddCuda, BitwiseTheCpuAdd) {
  at::manual_seed(41);
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    // 4096 blocks x 256 threads = 1048576 elements per grid round: the last size takes several.
    for (const int64_t n :
         {int64_t{1}, int64_t{15}, int64_t{33}, int64_t{200003}, int64_t{3000017}}) {
      const at::Tensor src = source(n, dtype);
      at::Tensor dst0 = at::randn({n});
      dst0.view(at::kInt)[0] = static_cast<int32_t>(0x80000000u);  // -0 + -0 stays -0
      const at::Tensor expected_add = dst0.clone().add_(src);
      const at::Tensor expected_overwrite = at::zeros({n}).add_(src);  // -0 becomes +0

      at::Tensor dst = dst0.to(at::kCUDA);
      widen_add_fused(dst, src.to(at::kCUDA), /*overwrite=*/false);
      EXPECT_TRUE(same_bits(dst, expected_add)) << dtype << " n=" << n;

      at::Tensor fresh = at::full({n}, 123.0f, at::TensorOptions().device(at::kCUDA));
      widen_add_fused(fresh, src.to(at::kCUDA), /*overwrite=*/true);
      EXPECT_TRUE(same_bits(fresh, expected_overwrite)) << dtype << " n=" << n;
    }
  }
}

TEST(WidenAddCuda, NaNStaysNaN) {
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    const at::Tensor src = at::full({5}, NAN, at::TensorOptions().dtype(dtype).device(at::kCUDA));
    at::Tensor dst = at::ones({5}, at::TensorOptions().device(at::kCUDA));
    widen_add_fused(dst, src, false);
    EXPECT_TRUE(dst.isnan().all().item<bool>());
  }
}

TEST(WidenAddCuda, EmptyAndBadArguments) {
  at::Tensor empty = at::empty({0}, at::TensorOptions().device(at::kCUDA));
  widen_add_fused(empty, at::empty({0}, empty.options().dtype(at::kHalf)), true);
  at::Tensor dst = at::zeros({4}, at::TensorOptions().device(at::kCUDA));
  EXPECT_THROW(widen_add_fused(dst, at::zeros({4}, dst.options()), false), c10::Error);  // float32
  EXPECT_THROW(widen_add_fused(dst, at::zeros({4}, at::kBFloat16), false), c10::Error);  // on CPU
  EXPECT_THROW(widen_add_fused(dst, at::zeros({5}, dst.options().dtype(at::kHalf)), false),
               c10::Error);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
