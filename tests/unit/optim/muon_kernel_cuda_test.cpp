// The CUDA twins of the fused Muon passes (kernels/muon_kernel_cuda.h) against the CPU AVX2 and
// AVX-512 variants (kernels/muon_kernel.h) on the same inputs: bitwise for every result that is
// not a NaN, and NaN exactly where the CPU gives NaN (float32 NaN payloads differ by design:
// x86 propagates an operand's, the GPU writes its canonical one). Every momentum rule, grad /
// direction / update / model dtype, lengths with and without a partial block and one past the
// kernel's block cap (the grid-stride loop), special values (infinities, NaN, signed zeros,
// subnormals, values that round to infinity), and exact rounding ties of the 16-bit stores.
// Each CPU variant already equals ATen's unfused ops bitwise (muon_kernel_test), so this makes
// the GPU bitwise ATen's CPU ops at those capabilities.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/optim/kernels/muon_kernel.h"
#include "mixtrain/optim/kernels/muon_kernel_cuda.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using MomentumKernel = void (*)(const MuonMomentumScalars&, float*, const void*, c10::ScalarType,
                                void*, c10::ScalarType, int64_t);
using ApplyKernel = void (*)(const MuonApplyScalars&, float*, const void*, c10::ScalarType, void*,
                             c10::ScalarType, int64_t);

struct CpuVariant {
  const char* name;
  MomentumKernel momentum;
  ApplyKernel apply;
};

// The vector variants this CPU runs (both use FMA, as the CUDA twins do).
std::vector<CpuVariant> cpu_variants() {
  std::vector<CpuVariant> out;
  const CpuCapability hw = hardware_cpu_capability();
  if (hw >= CpuCapability::kAvx2) out.push_back({"avx2", AVX2::muon_momentum, AVX2::muon_apply});
  if (hw >= CpuCapability::kAvx512) {
    out.push_back({"avx512", AVX512::muon_momentum, AVX512::muon_apply});
  }
  return out;
}

// Elements where the bits differ, not counting positions where both are NaN; a NaN on one side
// only counts.
int64_t mismatches(const at::Tensor& cpu, const at::Tensor& gpu) {
  EXPECT_EQ(cpu.scalar_type(), gpu.scalar_type());
  const at::Tensor a = cpu.contiguous();
  const at::Tensor b = gpu.cpu().contiguous();
  const auto int_type = a.element_size() == 4 ? at::kInt : at::kShort;
  const at::Tensor both_nan = at::isnan(a.to(at::kFloat)).logical_and(at::isnan(b.to(at::kFloat)));
  return a.view(int_type)
      .ne(b.view(int_type))
      .logical_and(both_nan.logical_not())
      .sum()
      .item<int64_t>();
}

// float32 values spanning many binades; the first elements replaced by special values.
at::Tensor inputs(int64_t n, uint64_t seed, at::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(seed);
  at::Tensor x = at::randn({n}, gen, at::kFloat) * at::exp(at::randn({n}, gen, at::kFloat) * 3);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {inf,      -inf,    std::nanf(""), 0.f,       -0.f,
                                      1e-40f,   -3e-41f, 3.4e38f,       -3.39e38f, 65520.f,
                                      -65504.f, 6e-8f,   -2.9e-8f,      1.17e-38f};
  for (size_t i = 0; i < special.size() && static_cast<int64_t>(i) < n; ++i) {
    x[static_cast<int64_t>(i)] = special[i];
  }
  return x.to(dtype);
}

enum class Style { kSum, kEma, kEmaAdd };

MuonMomentumScalars scalars(Style style, bool nesterov, double mu) {
  MuonMomentumScalars s;
  s.buffer_rule = style == Style::kSum ? MuonBufferRule::kMulAdd : MuonBufferRule::kLerp;
  s.direction_rule = !nesterov              ? MuonDirectionRule::kBuffer
                     : style == Style::kEma ? MuonDirectionRule::kLerp
                                            : MuonDirectionRule::kAdd;
  s.mu = static_cast<float>(mu);
  s.buffer_weight = static_cast<float>(1.0 - mu);
  return s;
}

void synchronize() {
  AT_CUDA_CHECK(cudaStreamSynchronize(at::cuda::getCurrentCUDAStream()));
}

void expect_momentum_matches(const CpuVariant& cpu, const MuonMomentumScalars& s,
                             at::ScalarType grad_dtype, at::ScalarType out_dtype, int64_t n,
                             const std::string& what) {
  SCOPED_TRACE(std::string(cpu.name) + " " + what + ", grad " + c10::toString(grad_dtype) +
               ", out " + c10::toString(out_dtype) + ", n " + std::to_string(n));
  at::Tensor cpu_buf = inputs(n, 1, at::kFloat);
  at::Tensor gpu_buf = cpu_buf.cuda();
  for (int step = 1; step <= 2; ++step) {
    const at::Tensor grad = inputs(n, 10 + step, grad_dtype);
    const at::Tensor gpu_grad = grad.cuda();
    at::Tensor cpu_out = at::empty({n}, out_dtype);
    at::Tensor gpu_out = at::empty({n}, gpu_grad.options().dtype(out_dtype));
    cpu.momentum(s, cpu_buf.data_ptr<float>(), grad.data_ptr(), grad_dtype, cpu_out.data_ptr(),
                 out_dtype, n);
    CUDA::muon_momentum(s, gpu_buf.data_ptr<float>(), gpu_grad.data_ptr(), grad_dtype,
                        gpu_out.data_ptr(), out_dtype, n, at::cuda::getCurrentCUDAStream());
    synchronize();
    EXPECT_EQ(mismatches(cpu_buf, gpu_buf), 0) << "buffer, step " << step;
    EXPECT_EQ(mismatches(cpu_out, gpu_out), 0) << "u, step " << step;
  }
}

// Exact rounding ties of the 16-bit stores, placed in the param with a zero update so that the
// param passes through unchanged: 1 + 2^-8 and 1 + 3 * 2^-8 (bfloat16 ties: round to the even
// 1 and 1 + 2^-6), 1 + 2^-11 and 1 + 3 * 2^-11 (float16 ties), 65520 (float16: rounds to inf).
const std::vector<float> kTies = {1.00390625f, -1.01171875f, 1.00048828125f, -1.00146484375f,
                                  65520.f};

void expect_apply_matches(const CpuVariant& cpu, const MuonApplyScalars& s,
                          at::ScalarType update_dtype, std::optional<at::ScalarType> model_dtype,
                          int64_t n) {
  SCOPED_TRACE(std::string(cpu.name) + " decay " + (s.decay_param ? "on" : "off") + ", update " +
               c10::toString(update_dtype) + ", model " +
               (model_dtype ? c10::toString(*model_dtype) : "none") + ", n " + std::to_string(n));
  at::Tensor cpu_param = inputs(n, 2, at::kFloat);
  at::Tensor update = inputs(n, 3, update_dtype);
  if (!s.decay_param) {
    for (size_t i = 0; i < kTies.size() && static_cast<int64_t>(i) < n; ++i) {
      cpu_param[static_cast<int64_t>(i)] = kTies[i];
      update[static_cast<int64_t>(i)] = 0;
    }
  }
  at::Tensor gpu_param = cpu_param.cuda();
  const at::Tensor gpu_update = update.cuda();
  const auto dtype = model_dtype.value_or(at::kBFloat16);
  at::Tensor cpu_model = at::full({n}, 7.0, dtype);
  at::Tensor gpu_model = cpu_model.cuda();
  cpu.apply(s, cpu_param.data_ptr<float>(), update.data_ptr(), update_dtype,
            model_dtype ? cpu_model.data_ptr() : nullptr, dtype, n);
  CUDA::muon_apply(s, gpu_param.data_ptr<float>(), gpu_update.data_ptr(), update_dtype,
                   model_dtype ? gpu_model.data_ptr() : nullptr, dtype, n,
                   at::cuda::getCurrentCUDAStream());
  synchronize();
  EXPECT_EQ(mismatches(cpu_param, gpu_param), 0) << "param";
  EXPECT_EQ(mismatches(cpu_model, gpu_model), 0) << "model param";
  if (!model_dtype) {
    EXPECT_TRUE(gpu_model.eq(7.0).all().item<bool>()) << "wrote a model param it was not given";
  }
}

// One element, a partial warp and a partial CPU vector block, several blocks plus a tail (the
// CPU variants' zero-padded tail included); kPastGrid, for a few cases, passes the kernels'
// 4096 x 256 grid once (grid-stride loop). Kept small: the test runs in a GPU machine's minutes.
const int64_t kLengths[] = {1, 7, 33, 4099};
constexpr int64_t kPastGrid = 4096 * 256 + 4099;

TEST(MuonKernelCuda, MomentumIsBitwiseTheCpuVectorVariants) {
  const auto variants = cpu_variants();
  if (variants.empty()) GTEST_SKIP() << "this CPU has no AVX2: nothing to compare with";
  const at::ScalarType dtypes[] = {at::kFloat, at::kBFloat16, at::kHalf};
  for (const auto& cpu : variants) {
    for (const int64_t n : kLengths) {
      // mu 0.95 and 0.3 take the two lerp formulas in opposite places; 0.6 sits near the switch.
      for (const Style style : {Style::kSum, Style::kEma, Style::kEmaAdd}) {
        for (const bool nesterov : {false, true}) {
          for (const double mu : {0.95, 0.3, 0.6}) {
            const std::string what = "style " + std::to_string(static_cast<int>(style)) +
                                     (nesterov ? " nesterov" : "") + " mu " + std::to_string(mu);
            for (const auto grad_dtype : dtypes) {
              for (const auto out_dtype : dtypes) {
                expect_momentum_matches(cpu, scalars(style, nesterov, mu), grad_dtype, out_dtype, n,
                                        what);
              }
            }
          }
        }
      }
    }
    for (const auto grad_dtype : dtypes) {
      expect_momentum_matches(cpu, scalars(Style::kSum, true, 0.95), grad_dtype, at::kBFloat16,
                              kPastGrid, "sum nesterov past the grid");
    }
  }
}

TEST(MuonKernelCuda, ApplyIsBitwiseTheCpuVectorVariants) {
  const auto variants = cpu_variants();
  if (variants.empty()) GTEST_SKIP() << "this CPU has no AVX2: nothing to compare with";
  const at::ScalarType dtypes[] = {at::kFloat, at::kBFloat16, at::kHalf};
  // No decay, alpha = -lr * scale; and decay 1 - 3e-3 * 0.1 with another alpha.
  const MuonApplyScalars cases[] = {
      {false, 1.f, static_cast<float>(-0.02 * 0.2 * 24)},
      {true, static_cast<float>(1.0 - 3e-3 * 0.1), static_cast<float>(-3e-3 * 1.5)}};
  for (const auto& cpu : variants) {
    for (const int64_t n : kLengths) {
      for (const auto& s : cases) {
        for (const auto update_dtype : dtypes) {
          for (const auto model : {std::optional<at::ScalarType>(), std::optional(at::kBFloat16),
                                   std::optional(at::kHalf)}) {
            expect_apply_matches(cpu, s, update_dtype, model, n);
          }
        }
      }
    }
    expect_apply_matches(cpu, cases[1], at::kBFloat16, at::kBFloat16, kPastGrid);
  }
}

TEST(MuonKernelCuda, ZeroLengthLaunchesNothingAndOtherDtypesThrow) {
  const auto stream = at::cuda::getCurrentCUDAStream();
  const MuonMomentumScalars ms = scalars(Style::kSum, true, 0.95);
  const MuonApplyScalars as{false, 1.f, -0.1f};
  // n = 0 with null pointers: nothing may touch them.
  CUDA::muon_momentum(ms, nullptr, nullptr, at::kFloat, nullptr, at::kBFloat16, 0, stream);
  CUDA::muon_apply(as, nullptr, nullptr, at::kBFloat16, nullptr, at::kBFloat16, 0, stream);
  synchronize();
  at::Tensor buf = at::zeros({4}, at::TensorOptions().device(at::kCUDA));
  at::Tensor wide = at::zeros({4}, buf.options().dtype(at::kDouble));
  EXPECT_THROW(CUDA::muon_momentum(ms, buf.data_ptr<float>(), wide.data_ptr(), at::kDouble,
                                   buf.data_ptr(), at::kFloat, 4, stream),
               c10::Error);
  EXPECT_THROW(CUDA::muon_momentum(ms, buf.data_ptr<float>(), buf.data_ptr(), at::kFloat,
                                   wide.data_ptr(), at::kDouble, 4, stream),
               c10::Error);
  EXPECT_THROW(CUDA::muon_apply(as, buf.data_ptr<float>(), wide.data_ptr(), at::kDouble, nullptr,
                                at::kBFloat16, 4, stream),
               c10::Error);
  EXPECT_THROW(CUDA::muon_apply(as, buf.data_ptr<float>(), buf.data_ptr(), at::kFloat,
                                buf.data_ptr(), at::kFloat, 4, stream),
               c10::Error);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
