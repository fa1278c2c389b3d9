// The fused Muon kernels against ATen's unfused ops, written out again here as Muon's references
// write them (Keller Jordan's and Moonlight's momentum, torch's add_/lerp_/mul_): bitwise at
// every CPU capability (ATen and ours on the same one, each in a child process), for every
// momentum rule, grad / direction / update / model-param dtype, vector tails, and thread counts.
#include "mixtrain/optim/kernels/muon_kernel.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/cpu_capability.h"
#include "support/per_capability.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using MomentumKernel = void (*)(const MuonMomentumScalars&, float*, const void*, c10::ScalarType,
                                void*, c10::ScalarType, int64_t);
using ApplyKernel = void (*)(const MuonApplyScalars&, float*, const void*, c10::ScalarType, void*,
                             c10::ScalarType, int64_t);

MomentumKernel momentum_kernel() {
  return select_kernel<MomentumKernel>(DEFAULT::muon_momentum, AVX2::muon_momentum,
                                       AVX512::muon_momentum);
}
ApplyKernel apply_kernel() {
  return select_kernel<ApplyKernel>(DEFAULT::muon_apply, AVX2::muon_apply, AVX512::muon_apply);
}

int64_t bit_differences(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.scalar_type(), b.scalar_type());
  EXPECT_EQ(a.sizes(), b.sizes());
  const auto int_type = a.element_size() == 4 ? at::kInt : at::kShort;
  return a.contiguous().view(int_type).ne(b.contiguous().view(int_type)).sum().item<int64_t>();
}

// Values spanning many binades, so a fused or unfused rounding cannot hide.
at::Tensor wide_range(int64_t n, at::ScalarType dtype) {
  return (at::randn({n}) * at::exp(at::randn({n}) * 3)).to(dtype);
}

enum class Style { kSum, kEma, kEmaAdd };

struct MomentumCase {
  Style style;
  bool nesterov;
  double mu;
};

std::string name(const MomentumCase& c) {
  const char* styles[] = {"sum", "ema", "ema_add"};
  return std::string(styles[static_cast<int>(c.style)]) + (c.nesterov ? " nesterov" : "") + " mu " +
         std::to_string(c.mu);
}

MuonMomentumScalars scalars(const MomentumCase& c) {
  MuonMomentumScalars s;
  s.buffer_rule = c.style == Style::kSum ? MuonBufferRule::kMulAdd : MuonBufferRule::kLerp;
  s.direction_rule = !c.nesterov              ? MuonDirectionRule::kBuffer
                     : c.style == Style::kEma ? MuonDirectionRule::kLerp
                                              : MuonDirectionRule::kAdd;
  s.mu = static_cast<float>(c.mu);
  s.buffer_weight = static_cast<float>(1.0 - c.mu);
  return s;
}

// The reference momentum step: updates buf, returns u.
at::Tensor reference_momentum(const MomentumCase& c, at::Tensor& buf, const at::Tensor& grad) {
  const at::Tensor g = grad.to(at::kFloat);
  if (c.style == Style::kSum) {
    buf.mul_(c.mu).add_(g);
  } else {
    buf.lerp_(g, 1.0 - c.mu);
  }
  if (!c.nesterov) return buf.clone();
  return c.style == Style::kEma ? g.lerp(buf, c.mu) : g.add(buf, c.mu);
}

void expect_momentum_matches(const MomentumCase& c, at::ScalarType grad_dtype,
                             at::ScalarType out_dtype, int64_t n) {
  SCOPED_TRACE(name(c) + ", grad " + c10::toString(grad_dtype) + ", out " +
               c10::toString(out_dtype) + ", n " + std::to_string(n));
  at::Tensor buf = wide_range(n, at::kFloat);
  at::Tensor ref_buf = buf.clone();
  for (int step = 1; step <= 2; ++step) {
    const at::Tensor grad = wide_range(n, grad_dtype);
    at::Tensor out = at::empty({n}, out_dtype);
    momentum_kernel()(scalars(c), buf.data_ptr<float>(), grad.data_ptr(), grad_dtype,
                      out.data_ptr(), out_dtype, n);
    const at::Tensor u = reference_momentum(c, ref_buf, grad);
    EXPECT_EQ(bit_differences(buf, ref_buf), 0) << "buffer, step " << step;
    EXPECT_EQ(bit_differences(out, u.to(out_dtype)), 0) << "u, step " << step;
  }
}

struct ApplyCase {
  double lr, weight_decay, scale;
};

void expect_apply_matches(const ApplyCase& c, at::ScalarType update_dtype,
                          std::optional<at::ScalarType> model_dtype, int64_t n) {
  SCOPED_TRACE("wd " + std::to_string(c.weight_decay) + ", update " + c10::toString(update_dtype) +
               ", model " + (model_dtype ? c10::toString(*model_dtype) : "none") + ", n " +
               std::to_string(n));
  const at::Tensor init = at::randn({n});
  at::Tensor param = init.clone();
  at::Tensor ref = init.clone();
  at::Tensor model = at::full({n}, 7.0, model_dtype.value_or(at::kBFloat16));
  const at::Tensor update = wide_range(n, update_dtype);
  MuonApplyScalars s;
  s.decay_param = c.weight_decay != 0.0;
  s.decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
  s.alpha = static_cast<float>(-c.lr * c.scale);
  apply_kernel()(s, param.data_ptr<float>(), update.data_ptr(), update_dtype,
                 model_dtype ? model.data_ptr() : nullptr, model.scalar_type(), n);
  // muon_apply_update's ops.
  if (c.weight_decay != 0.0) ref.mul_(1.0 - c.lr * c.weight_decay);
  ref.add_(update, -c.lr * c.scale);
  EXPECT_EQ(bit_differences(param, ref), 0) << "param";
  if (model_dtype) {
    EXPECT_EQ(bit_differences(model, ref.to(*model_dtype)), 0) << "model param";
  } else {
    EXPECT_TRUE(model.eq(7.0).all().item<bool>()) << "wrote a model param it was not given";
  }
}

// Lengths: one element, a partial vector, several vectors plus a tail, many parallel tasks.
const int64_t kLengths[] = {1, 7, 33, 200003};

TEST(MuonKernel, BitwiseEqualToUnfusedOpsAtCurrentCapability) {
  MIXTRAIN_ANNOUNCE_CAPABILITY_OR_SKIP();
  at::manual_seed(11);
  // mu 0.95: lerp_(g, 0.05) takes lerp's small-weight formula (|w| < 0.5) and lerp(buf, 0.95)
  // the other; mu 0.3 swaps them; mu 0.6 puts both weights near the switch (0.4 and 0.6).
  std::vector<MomentumCase> cases;
  for (const Style style : {Style::kSum, Style::kEma, Style::kEmaAdd}) {
    for (const bool nesterov : {false, true}) {
      for (const double mu : {0.95, 0.3, 0.6}) cases.push_back({style, nesterov, mu});
    }
  }
  const at::ScalarType dtypes[] = {at::kFloat, at::kBFloat16, at::kHalf};
  for (const int64_t n : kLengths) {
    for (const auto& c : cases) {
      for (const auto grad_dtype : dtypes) {
        for (const auto out_dtype : dtypes) expect_momentum_matches(c, grad_dtype, out_dtype, n);
      }
    }
    for (const ApplyCase c : {ApplyCase{0.02, 0.0, 0.2 * 24}, ApplyCase{3e-3, 0.1, 1.5}}) {
      for (const auto update_dtype : dtypes) {
        for (const auto model : {std::optional<at::ScalarType>(), std::optional(at::kBFloat16),
                                 std::optional(at::kHalf)}) {
          expect_apply_matches(c, update_dtype, model, n);
        }
      }
    }
  }
}

TEST(MuonKernel, BitwiseEqualToUnfusedOpsAtEveryCpuCapability) {
  testing::expect_passes_at_every_capability(
      "MuonKernel.BitwiseEqualToUnfusedOpsAtCurrentCapability");
}

TEST(MuonKernel, ResultDoesNotDependOnThreadCount) {
  const int64_t n = 5 * (1 << 16) + 3;  // several parallel tasks and a tail
  at::manual_seed(3);
  const at::Tensor buf0 = wide_range(n, at::kFloat);
  const at::Tensor grad = wide_range(n, at::kBFloat16);
  const at::Tensor param0 = at::randn({n});
  const MuonMomentumScalars ms = scalars({Style::kSum, true, 0.95});
  const MuonApplyScalars as{true, 0.999f, -0.01f};
  const int threads = at::get_num_threads();
  std::vector<at::Tensor> results;
  for (const int t : {1, 2, 3}) {
    at::set_num_threads(t);
    at::Tensor buf = buf0.clone(), u = at::empty({n}, at::kBFloat16), param = param0.clone(),
               model = at::empty({n}, at::kBFloat16);
    momentum_kernel()(ms, buf.data_ptr<float>(), grad.data_ptr(), at::kBFloat16, u.data_ptr(),
                      at::kBFloat16, n);
    apply_kernel()(as, param.data_ptr<float>(), u.data_ptr(), at::kBFloat16, model.data_ptr(),
                   at::kBFloat16, n);
    results.push_back(at::cat({buf, param, u.to(at::kFloat), model.to(at::kFloat)}));
  }
  at::set_num_threads(threads);
  EXPECT_EQ(bit_differences(results[0], results[1]), 0);
  EXPECT_EQ(bit_differences(results[0], results[2]), 0);
}

TEST(MuonKernel, RejectsOtherDtypes) {
  float buf[4] = {}, out[4] = {};
  const double grad[4] = {};
  const MuonMomentumScalars ms = scalars({Style::kSum, true, 0.95});
  EXPECT_THROW(momentum_kernel()(ms, buf, grad, at::kDouble, out, at::kFloat, 4), c10::Error);
  EXPECT_THROW(momentum_kernel()(ms, buf, buf, at::kFloat, out, at::kDouble, 4), c10::Error);
  const MuonApplyScalars as{false, 1.f, -0.1f};
  EXPECT_THROW(apply_kernel()(as, buf, grad, at::kDouble, nullptr, at::kFloat, 4), c10::Error);
  EXPECT_THROW(apply_kernel()(as, buf, out, at::kFloat, out, at::kFloat, 4), c10::Error);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
