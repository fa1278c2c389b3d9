// core/cpu_gemm: the rule (which CPUs run bf16/fp16 GEMMs natively, the overrides), that each
// gemm:: op on the widened path runs ATen's float32 op (observed at the dispatcher, so the test
// means the same on every CPU), and its numerics: the result and every gradient within the bound
// of one float32 GEMM rounded once, against an independent float64 product.
#include "mixtrain/core/cpu_gemm.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <functional>
#include <string>
#include <vector>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

CpuGemmFeatures amx() {
  CpuGemmFeatures f;
  f.avx2 = f.avx512_core = f.avx512_bf16 = f.amx_bf16 = f.avx512_fp16 = true;
  return f;
}
CpuGemmFeatures zen4() {  // AVX512-BF16, no AVX512-FP16
  CpuGemmFeatures f;
  f.avx2 = f.avx512_core = f.avx512_bf16 = true;
  return f;
}
CpuGemmFeatures skylake() {  // AVX-512 without bf16 arithmetic: oneDNN emulates it
  CpuGemmFeatures f;
  f.avx2 = f.avx512_core = true;
  return f;
}
CpuGemmFeatures avx2_only() {
  CpuGemmFeatures f;
  f.avx2 = true;
  return f;
}

using P = CpuGemmPath;

TEST(CpuGemmRule, NativeExactlyWhereTheCpuHasTheArithmetic) {
  struct Case {
    const char* name;
    CpuGemmFeatures features;
    P bf16, fp16;
    const char* cpu_class;
  };
  for (const Case& c : {Case{"amx", amx(), P::kNative, P::kNative, "amx"},
                        Case{"zen4", zen4(), P::kNative, P::kWidened, "avx512-bf16"},
                        Case{"skylake", skylake(), P::kWidened, P::kWidened, "avx512"},
                        Case{"avx2", avx2_only(), P::kWidened, P::kWidened, "avx2"},
                        Case{"none", CpuGemmFeatures{}, P::kWidened, P::kWidened, "other"}}) {
    const CpuGemmChoice choice = decide_cpu_gemm(c.features, nullptr);
    EXPECT_EQ(choice.bf16, c.bf16) << c.name;
    EXPECT_EQ(choice.fp16, c.fp16) << c.name;
    EXPECT_EQ(choice.cpu_class, c.cpu_class) << c.name;
    EXPECT_EQ(decide_cpu_gemm(c.features, "auto").bf16, c.bf16) << c.name;
    EXPECT_EQ(decide_cpu_gemm(c.features, "").fp16, c.fp16) << c.name;
  }
  CpuGemmFeatures amx_fp16_only = skylake();  // AMX-FP16 without AVX512-FP16 still has it
  amx_fp16_only.amx_fp16 = true;
  EXPECT_EQ(decide_cpu_gemm(amx_fp16_only, nullptr).fp16, P::kNative);
  EXPECT_EQ(decide_cpu_gemm(amx_fp16_only, nullptr).bf16, P::kWidened);
}

TEST(CpuGemmRule, OneDnnsCeilingAndSwitchLowerItAsTheyLowerAten) {
  auto with = [](CpuGemmFeatures f, const char* isa) {
    f.onednn_max_isa = isa;
    return decide_cpu_gemm(f, nullptr);
  };
  // The documented AVX2 emulation: oneDNN refuses bf16 below avx512_core, so ATen takes its
  // generic loop.
  EXPECT_EQ(with(amx(), "AVX2").bf16, P::kWidened);
  EXPECT_EQ(with(amx(), "AVX2").fp16, P::kWidened);
  EXPECT_NE(with(amx(), "AVX2").reason.find("ONEDNN_MAX_CPU_ISA=AVX2"), std::string::npos);
  EXPECT_EQ(with(amx(), "AVX512_CORE").bf16, P::kWidened);  // emulated bf16: widened is faster
  EXPECT_EQ(with(amx(), "AVX512_CORE_BF16").bf16, P::kNative);
  EXPECT_EQ(with(amx(), "AVX512_CORE_BF16").fp16, P::kWidened);
  EXPECT_EQ(with(amx(), "AVX512_CORE_FP16").fp16, P::kNative);
  EXPECT_EQ(with(amx(), "AVX512_CORE_AMX").fp16, P::kNative);
  EXPECT_EQ(with(amx(), "DEFAULT").bf16, P::kNative);
  EXPECT_EQ(with(amx(), "NOT_AN_ISA").bf16, P::kNative);              // oneDNN ignores it
  EXPECT_EQ(with(avx2_only(), "AVX512_CORE_AMX").bf16, P::kWidened);  // a ceiling never raises
  CpuGemmFeatures off = amx();
  off.mkldnn_enabled = false;
  EXPECT_EQ(decide_cpu_gemm(off, nullptr).bf16, P::kWidened);
  EXPECT_EQ(decide_cpu_gemm(off, nullptr).fp16, P::kWidened);
}

TEST(CpuGemmRule, TheVariableForcesEitherPathAndRefusesOtherValues) {
  for (const CpuGemmFeatures& f : {amx(), avx2_only()}) {
    EXPECT_EQ(decide_cpu_gemm(f, "widened").bf16, P::kWidened);
    EXPECT_EQ(decide_cpu_gemm(f, "widened").fp16, P::kWidened);
    EXPECT_EQ(decide_cpu_gemm(f, "native").bf16, P::kNative);
    EXPECT_EQ(decide_cpu_gemm(f, "native").fp16, P::kNative);
    EXPECT_EQ(decide_cpu_gemm(f, "native").reason, "MIXTRAIN_CPU_GEMM=native");
  }
  try {
    decide_cpu_gemm(amx(), "fast");
    FAIL() << "accepted MIXTRAIN_CPU_GEMM=fast";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MIXTRAIN_CPU_GEMM='fast'"), std::string::npos)
        << e.what();
  }
}

TEST(CpuGemmRule, TheScopedPathForcesAndRestores) {
  const P before = cpu_gemm_path(at::kBFloat16);
  {
    ScopedCpuGemmPath widened(P::kWidened);
    EXPECT_EQ(cpu_gemm_path(at::kBFloat16), P::kWidened);
    EXPECT_EQ(cpu_gemm_path(at::kHalf), P::kWidened);
    EXPECT_EQ(cpu_gemm_path(at::kFloat), P::kNative);  // float32 is never touched
    {
      ScopedCpuGemmPath native(P::kNative);
      EXPECT_EQ(cpu_gemm_path(at::kHalf), P::kNative);
    }
    EXPECT_EQ(cpu_gemm_path(at::kHalf), P::kWidened);
    EXPECT_NE(cpu_gemm_summary().find("forced in this process"), std::string::npos);
  }
  EXPECT_EQ(cpu_gemm_path(at::kBFloat16), before);
  EXPECT_TRUE(widens_gemm(at::ones({2, 2}, at::kBFloat16)) == (before == P::kWidened));
}

// The dtypes of the GEMM ops ATen dispatched while alive, on this thread: which path ran.
class GemmObserver {
 public:
  GemmObserver() {
    handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&GemmObserver::record)
                                             .needsInputs(true)
                                             .scopes({at::RecordScope::FUNCTION}));
    seen().clear();
  }
  ~GemmObserver() { at::removeCallback(handle_); }
  // "aten::mm:Float" for each GEMM op seen, in order.
  static std::vector<std::string>& seen() {
    thread_local std::vector<std::string> s;
    return s;
  }

 private:
  static std::unique_ptr<at::ObserverContext> record(const at::RecordFunction& fn) {
    const std::string name = fn.name();
    if (name != "aten::mm" && name != "aten::bmm" && name != "aten::addmm" &&
        name != "aten::baddbmm") {
      return nullptr;
    }
    for (const c10::IValue& input : fn.inputs()) {
      if (input.isTensor()) {
        seen().push_back(name + ":" + c10::toString(input.toTensor().scalar_type()));
        break;
      }
    }
    return nullptr;
  }
  at::CallbackHandle handle_;
};

std::string all_seen() {
  std::string s;
  for (const auto& x : GemmObserver::seen()) s += x + " ";
  return s;
}

TEST(CpuGemmOps, TheWidenedPathRunsFloat32GemmsAndTheNativePathTheDtypes) {
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    const at::Tensor a = at::randn({24, 16}).to(dtype), b = at::randn({16, 8}).to(dtype);
    const at::Tensor a3 = a.view({3, 8, 16}), b3 = at::randn({3, 16, 8}).to(dtype);
    const at::Tensor c3 = at::randn({3, 8, 8}).to(dtype), bias = at::randn({8}).to(dtype);
    for (const P path : {P::kWidened, P::kNative}) {
      ScopedCpuGemmPath forced(path);
      const std::string want = path == P::kWidened ? "Float" : c10::toString(dtype);
      GemmObserver observer;
      const std::vector<at::Tensor> outs = {
          gemm::mm(a, b),       gemm::addmm(bias, a, b),
          gemm::bmm(a3, b3),    gemm::baddbmm(c3, a3, b3, 0.5, 2.0),
          gemm::matmul(a3, b3), gemm::linear(a, b.t().contiguous(), bias)};
      for (const auto& o : outs) EXPECT_EQ(o.scalar_type(), dtype);
      ASSERT_FALSE(GemmObserver::seen().empty());
      for (const auto& s : GemmObserver::seen()) {
        EXPECT_EQ(s.substr(s.rfind(':') + 1), want) << all_seen();
      }
    }
  }
}

TEST(CpuGemmOps, OtherDtypesAndMixedOperandsGoToAtenUnchanged) {
  ScopedCpuGemmPath widened(P::kWidened);
  const at::Tensor a = at::randn({6, 5}), b = at::randn({5, 4});
  EXPECT_TRUE(at::equal(gemm::mm(a, b), at::mm(a, b)));
  const at::Tensor ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  EXPECT_TRUE(at::equal(gemm::matmul(ad, bd), at::matmul(ad, bd)));
  // Mixed dtypes are ATen's to refuse, as before.
  EXPECT_THROW(gemm::mm(a.to(at::kBFloat16), b), c10::Error);
}

// |widened - exact| <= half an ulp of the dtype at the exact value (the one rounding) plus the
// float32 sum's error bound k * 2^-24 * sum_k |a||b| (Higham's gamma_k, first order), with the
// exact value from float64 on the same (exactly representable) operands. Any second rounding
// to bf16 (e.g. rounding the products) would break it on these sizes.
// By how much |got - exact| exceeds that bound (<= 0 everywhere: within it).
at::Tensor excess_over_one_rounding(const at::Tensor& got, const at::Tensor& exact,
                                    const at::Tensor& abs_sum, int64_t k) {
  const int mantissa = got.scalar_type() == at::kBFloat16 ? 8 : 11;  // with the implicit bit
  const at::Tensor e = exact.to(at::kDouble);
  // ulp(x) = 2^(floor(log2|x|) - (mantissa - 1)); fp16's subnormals have ulp 2^-24.
  at::Tensor ulp = at::pow(2.0, at::floor(at::log2(e.abs().clamp_min(1e-30))) - (mantissa - 1));
  if (got.scalar_type() == at::kHalf) ulp = ulp.clamp_min(std::ldexp(1.0, -24));
  const at::Tensor bound = 0.5 * ulp + double(k) * std::ldexp(1.0, -24) * abs_sum;
  return (got.to(at::kDouble) - e).abs() - bound;
}

void expect_one_float32_gemm_rounded_once(const at::Tensor& got, const at::Tensor& exact,
                                          const at::Tensor& abs_sum, int64_t k,
                                          const std::string& what) {
  const at::Tensor excess = excess_over_one_rounding(got, exact, abs_sum, k);
  EXPECT_TRUE(excess.le(0).all().item<bool>())
      << what << ": worst excess " << excess.max().item<double>();
}

TEST(CpuGemmOps, WidenedResultsAndGradientsAreOneFloat32GemmRoundedOnce) {
  ScopedCpuGemmPath widened(P::kWidened);
  const int64_t m = 33, k = 96, n = 40;
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    const std::string tag = c10::toString(dtype);
    at::manual_seed(3);
    const at::Tensor a0 = at::randn({m, k}).to(dtype), b0 = at::randn({k, n}).to(dtype);
    const at::Tensor bias0 = at::randn({n}).to(dtype);
    const at::Tensor g = at::randn({m, n}).to(dtype);  // the upstream gradient
    const at::Tensor ad = a0.to(at::kDouble), bd = b0.to(at::kDouble), gd = g.to(at::kDouble);

    at::Tensor a = a0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    at::Tensor bias = bias0.clone().requires_grad_(true);
    const at::Tensor out = gemm::addmm(bias, a, b);
    out.backward(g);
    ASSERT_EQ(out.scalar_type(), dtype);
    ASSERT_EQ(a.grad().scalar_type(), dtype);
    expect_one_float32_gemm_rounded_once(out, at::addmm(bias0.to(at::kDouble), ad, bd),
                                         at::mm(ad.abs(), bd.abs()) + bias0.to(at::kDouble).abs(),
                                         k + 1, tag + " addmm");
    expect_one_float32_gemm_rounded_once(a.grad(), at::mm(gd, bd.t()),
                                         at::mm(gd.abs(), bd.abs().t()), n, tag + " grad a");
    expect_one_float32_gemm_rounded_once(b.grad(), at::mm(ad.t(), gd),
                                         at::mm(ad.abs().t(), gd.abs()), m, tag + " grad b");
    expect_one_float32_gemm_rounded_once(bias.grad(), gd.sum(0), gd.abs().sum(0), m,
                                         tag + " grad bias");

    // baddbmm as Newton-Schulz uses it: beta C + alpha A B, one rounding.
    const at::Tensor a3 = a0.view({3, 11, k}), c3 = at::randn({3, 11, n}).to(dtype);
    const at::Tensor b3 = b0.unsqueeze(0).expand({3, k, n}).contiguous();
    const at::Tensor got = gemm::baddbmm(c3, a3, b3, -1.5, 0.25);
    const at::Tensor a3d = a3.to(at::kDouble), b3d = b3.to(at::kDouble);
    expect_one_float32_gemm_rounded_once(
        got, at::baddbmm(c3.to(at::kDouble), a3d, b3d, -1.5, 0.25),
        1.5 * c3.to(at::kDouble).abs() + 0.25 * at::bmm(a3d.abs(), b3d.abs()), k + 1,
        tag + " baddbmm");
    expect_one_float32_gemm_rounded_once(gemm::matmul(a3, b3), at::matmul(a3d, b3d),
                                         at::matmul(a3d.abs(), b3d.abs()), k, tag + " matmul");
  }
}

TEST(CpuGemmOps, SharedOperandsAreWidenedOnceWithTheSameValuesAndGradients) {
  // Newton-Schulz's X X^T and b A + c A A pass one tensor (or its transpose) several times: it
  // is widened once, and the result and gradient are those of a separate copy per operand.
  ScopedCpuGemmPath widened(P::kWidened);
  at::manual_seed(5);
  const at::Tensor x0 = at::randn({2, 12, 40}).to(at::kBFloat16);
  const at::Tensor f = x0.to(at::kFloat);
  auto casts = [](const std::function<void()>& run) {
    thread_local int64_t n = 0;
    n = 0;
    auto handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction& fn)
                                       -> std::unique_ptr<at::ObserverContext> {
          if (std::string(fn.name()) == "aten::_to_copy") ++n;
          return nullptr;
        }).scopes({at::RecordScope::FUNCTION}));
    run();
    at::removeCallback(handle);
    return n;
  };
  at::Tensor gram;
  EXPECT_EQ(casts([&] { gram = gemm::bmm(x0, x0.transpose(1, 2)); }), 2);  // widen once, round
  EXPECT_TRUE(at::equal(gram, at::bmm(f, f.transpose(1, 2)).to(at::kBFloat16)));
  const at::Tensor g = gram.to(at::kFloat);
  at::Tensor poly;
  EXPECT_EQ(casts([&] { poly = gemm::baddbmm(gram, gram, gram, -4.7, 2.0); }), 2);
  EXPECT_TRUE(at::equal(poly, at::baddbmm(g, g, g, -4.7, 2.0).to(at::kBFloat16)));

  at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor w = at::randn({2, 12, 12}).to(at::kBFloat16);
  (gemm::bmm(x, x.transpose(1, 2)) * w).sum().backward();
  at::Tensor xf = f.clone().requires_grad_(true);
  (at::bmm(xf.to(at::kFloat), xf.to(at::kFloat).transpose(1, 2)).to(at::kBFloat16) * w)
      .sum()
      .backward();
  ASSERT_EQ(x.grad().scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(x.grad(), xf.grad().to(at::kBFloat16)));
}

TEST(CpuGemmOps, TheBoundCatchesASecondRounding) {
  // The check above must be able to fail: products rounded to bf16 before the sum (what a
  // GEMM accumulating in bf16 would do) break it.
  at::manual_seed(3);
  const int64_t k = 96;
  const at::Tensor a = at::randn({33, k}).to(at::kBFloat16),
                   b = at::randn({k, 40}).to(at::kBFloat16);
  const at::Tensor ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  const at::Tensor rounded_products =
      (a.to(at::kFloat).unsqueeze(2) * b.to(at::kFloat).unsqueeze(0)).to(at::kBFloat16);
  const at::Tensor twice = rounded_products.to(at::kFloat).sum(1).to(at::kBFloat16);
  const at::Tensor excess =
      excess_over_one_rounding(twice, at::mm(ad, bd), at::mm(ad.abs(), bd.abs()), k);
  EXPECT_FALSE(excess.le(0).all().item<bool>());
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
