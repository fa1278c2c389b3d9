// model/layers.h: dense() against linear on the same GEMM path (core/cpu_gemm.h: at::linear on
// the native path and for float32, gemm::linear's widened form on the widened one), bit for bit
// in the output and in every gradient (bfloat16 and float32; 2-D and 3-D inputs; with and
// without a bias; a non-contiguous input, which goes to linear itself), on both paths whatever
// the machine's own choice, and in fewer dispatched ops.
#include "mixtrain/model/layers.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "mixtrain/core/cpu_gemm.h"
#include "mixtrain/core/op_counter.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

struct Outcome {
  at::Tensor out, grad_x, grad_w, grad_b;
};

// out = f(x, w, b) and the gradients of (out * g).sum().
template <typename F>
Outcome run_both(F f, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0,
                 const at::Tensor& g) {
  const at::Tensor x = x0.clone().set_requires_grad(true);
  const at::Tensor w = w0.clone().set_requires_grad(true);
  const at::Tensor b = b0.defined() ? b0.clone().set_requires_grad(true) : at::Tensor();
  Outcome r;
  r.out = f(x, w, b);
  (r.out * g).sum().backward();
  r.grad_x = x.grad();
  r.grad_w = w.grad();
  if (b.defined()) r.grad_b = b.grad();
  return r;
}

TEST(LayersTest, DenseIsLinearBitForBit) {
  for (const CpuGemmPath path : {CpuGemmPath::kNative, CpuGemmPath::kWidened}) {
    const ScopedCpuGemmPath forced(path);
    at::manual_seed(4);
    for (const auto dtype : {at::kBFloat16, at::kFloat}) {
      for (const std::vector<int64_t>& lead : {std::vector<int64_t>{37}, {3, 29}, {2, 3, 11}}) {
        for (const bool with_bias : {false, true}) {
          std::vector<int64_t> in_shape = lead, out_shape = lead;
          in_shape.push_back(48);
          out_shape.push_back(40);
          const at::Tensor x = at::randn(in_shape).to(dtype);
          const at::Tensor w = at::randn({40, 48}).to(dtype);
          const at::Tensor b = with_bias ? at::randn({40}).to(dtype) : at::Tensor();
          const at::Tensor g = at::randn(out_shape).to(dtype);
          const Outcome mine = run_both([](const at::Tensor& x, const at::Tensor& w,
                                           const at::Tensor& b) { return dense(x, w, b); },
                                        x, w, b, g);
          const Outcome reference =
              run_both([](const at::Tensor& x, const at::Tensor& w,
                          const at::Tensor& b) { return gemm::linear(x, w, b); },
                       x, w, b, g);
          SCOPED_TRACE(::testing::Message()
                       << cpu_gemm_path_name(path) << ", dtype " << dtype << ", dims "
                       << in_shape.size() << ", bias " << with_bias);
          EXPECT_TRUE(same_bits(mine.out, reference.out));
          EXPECT_TRUE(same_bits(mine.grad_x, reference.grad_x));
          EXPECT_TRUE(same_bits(mine.grad_w, reference.grad_w));
          if (with_bias) {
            EXPECT_TRUE(same_bits(mine.grad_b, reference.grad_b));
          }
        }
      }
    }
  }
}

TEST(LayersTest, DenseTakesNonContiguousInputsThroughLinear) {
  const at::Tensor x = at::randn({48, 6}).t();  // [6, 48], not contiguous
  const at::Tensor w = at::randn({40, 48});
  EXPECT_TRUE(same_bits(dense(x, w), at::linear(x, w)));
  const ScopedCpuGemmPath widened(CpuGemmPath::kWidened);
  const at::Tensor xb = x.to(at::kBFloat16), wb = w.to(at::kBFloat16);
  EXPECT_TRUE(same_bits(dense(xb, wb), gemm::linear(xb, wb, at::Tensor())));
}

TEST(LayersTest, DenseDispatchesFewerOpsThanLinear) {
  const at::Tensor x = at::randn({2, 8, 48}), w = at::randn({40, 48});
  OpCountScope counting;
  OpCounts start = op_counts();
  at::Tensor a = at::linear(x, w);
  const int64_t linear_ops = (op_counts() - start).ops;
  start = op_counts();
  at::Tensor b = dense(x, w);
  const int64_t dense_ops = (op_counts() - start).ops;
  EXPECT_LT(dense_ops, linear_ops);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
