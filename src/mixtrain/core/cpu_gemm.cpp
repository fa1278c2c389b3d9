#include "mixtrain/core/cpu_gemm.h"

#include <ATen/ATen.h>
#include <ATen/cpu/Utils.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <set>
#include <utility>
#include <vector>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace {

// ONEDNN_MAX_CPU_ISA values (oneDNN 3.x spellings) at or above the first ISA with native bf16
// (avx512_core_bf16) and native fp16 (avx512_core_fp16, alias avx10_1_512) arithmetic.
const std::set<std::string>& isas_with_bf16() {
  static const std::set<std::string> isas = {"AVX512_CORE_BF16",
                                             "AVX512_CORE_FP16",
                                             "AVX10_1_512",
                                             "AVX512_CORE_AMX",
                                             "AVX10_1_512_AMX",
                                             "AVX512_CORE_AMX_FP16",
                                             "AVX10_1_512_AMX_FP16",
                                             "AVX10_2_512",
                                             "AVX10_2_512_AMX_2",
                                             "DEFAULT",
                                             "ALL"};
  return isas;
}
const std::set<std::string>& isas_without_bf16() {
  static const std::set<std::string> isas = {
      "SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"};
  return isas;
}
// Whether oneDNN may use its native bf16 (fp16) kernels under the ceiling ONEDNN_MAX_CPU_ISA.
bool ceiling_allows(const std::string& ceiling, bool fp16) {
  if (isas_without_bf16().count(ceiling)) return false;
  if (!isas_with_bf16().count(ceiling)) return true;  // unset, or a name oneDNN ignores
  return !fp16 || ceiling != "AVX512_CORE_BF16";
}

bool flag(const std::unordered_map<std::string, c10::IValue>& caps, const char* name) {
  const auto it = caps.find(name);
  return it != caps.end() && it->second.isBool() && it->second.toBool();
}

// -1: no override; else a CpuGemmPath.
std::atomic<int> g_forced{-1};

}  // namespace

CpuGemmChoice decide_cpu_gemm(const CpuGemmFeatures& f, const char* requested) {
  CpuGemmChoice choice;
  choice.cpu_class = f.amx_bf16                       ? "amx"
                     : f.avx512_core && f.avx512_bf16 ? "avx512-bf16"
                     : f.avx512_core                  ? "avx512"
                     : f.avx2                         ? "avx2"
                                                      : "other";
  const std::string want = requested == nullptr ? "" : requested;
  if (want == "native" || want == "widened") {
    const CpuGemmPath path = want == "native" ? CpuGemmPath::kNative : CpuGemmPath::kWidened;
    choice.bf16 = choice.fp16 = path;
    choice.reason = "MIXTRAIN_CPU_GEMM=" + want;
    return choice;
  }
  if (!want.empty() && want != "auto") {
    throw ConfigError("MIXTRAIN_CPU_GEMM='" + want + "' is not one of auto, native, widened");
  }
  // Native only where oneDNN has the arithmetic (bench/README.md, cpu_gemm): on AMX 2-7x the
  // float32 rate; without it 4x (oneDNN's emulation on plain AVX-512) to 300x (ATen's generic
  // loop below AVX-512) slower than widened. AVX512-BF16 without AMX stays native although an
  // emulation of it on Intel cores measured widened faster: it keeps those machines' bits (the
  // bench README says how to decide on a real one).
  const bool bf16_hw = f.avx512_core && (f.avx512_bf16 || f.amx_bf16);
  const bool fp16_hw = f.avx512_core && (f.avx512_fp16 || f.amx_fp16);
  const bool bf16 = f.mkldnn_enabled && bf16_hw && ceiling_allows(f.onednn_max_isa, false);
  const bool fp16 = f.mkldnn_enabled && fp16_hw && ceiling_allows(f.onednn_max_isa, true);
  choice.bf16 = bf16 ? CpuGemmPath::kNative : CpuGemmPath::kWidened;
  choice.fp16 = fp16 ? CpuGemmPath::kNative : CpuGemmPath::kWidened;
  if (!f.mkldnn_enabled) {
    choice.reason = "ATen's oneDNN is switched off";
  } else if ((bf16_hw && !bf16) || (fp16_hw && !fp16)) {
    choice.reason = "ONEDNN_MAX_CPU_ISA=" + f.onednn_max_isa;
  } else {
    choice.reason = std::string("bf16 arithmetic ") + (bf16_hw ? "in" : "not in") +
                    " the CPU, fp16 " + (fp16_hw ? "in" : "not in") + " the CPU";
  }
  return choice;
}

CpuGemmFeatures detect_cpu_gemm_features() {
  CpuGemmFeatures f;
  const auto caps = at::cpu::get_cpu_capabilities();
  f.avx512_core = flag(caps, "avx512_f") && flag(caps, "avx512_bw") && flag(caps, "avx512_vl") &&
                  flag(caps, "avx512_dq");
  f.avx512_bf16 = flag(caps, "avx512_bf16");
  f.amx_bf16 = flag(caps, "amx_bf16");
  f.avx512_fp16 = flag(caps, "avx512_fp16");
  f.amx_fp16 = flag(caps, "amx_fp16");
  f.avx2 = flag(caps, "avx2");
  f.mkldnn_enabled = at::globalContext().userEnabledMkldnn();
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (isa == nullptr) isa = std::getenv("DNNL_MAX_CPU_ISA");  // oneDNN's older spelling
  if (isa != nullptr) {
    for (const char* c = isa; *c != '\0'; ++c) f.onednn_max_isa += char(std::toupper(*c));
  }
  return f;
}

const CpuGemmChoice& cpu_gemm_choice() {
  static const CpuGemmChoice choice =
      decide_cpu_gemm(detect_cpu_gemm_features(), std::getenv("MIXTRAIN_CPU_GEMM"));
  return choice;
}

CpuGemmPath cpu_gemm_path(c10::ScalarType dtype) {
  const int forced = g_forced.load(std::memory_order_relaxed);
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return CpuGemmPath::kNative;
  if (forced >= 0) return static_cast<CpuGemmPath>(forced);
  return dtype == at::kBFloat16 ? cpu_gemm_choice().bf16 : cpu_gemm_choice().fp16;
}

const char* cpu_gemm_path_name(CpuGemmPath path) {
  return path == CpuGemmPath::kNative ? "native" : "widened";
}

std::string cpu_gemm_summary() {
  const CpuGemmChoice& c = cpu_gemm_choice();
  std::string s = std::string("bf16 ") + cpu_gemm_path_name(cpu_gemm_path(at::kBFloat16)) +
                  ", fp16 " + cpu_gemm_path_name(cpu_gemm_path(at::kHalf)) + " (CPU class " +
                  c.cpu_class + "; " + c.reason;
  if (g_forced.load() >= 0) s += "; forced in this process";
  return s + ")";
}

bool widens_gemm(const at::Tensor& operand) {
  const c10::ScalarType dtype = operand.scalar_type();
  return (dtype == at::kBFloat16 || dtype == at::kHalf) && operand.is_cpu() &&
         cpu_gemm_path(dtype) == CpuGemmPath::kWidened;
}

ScopedCpuGemmPath::ScopedCpuGemmPath(CpuGemmPath path)
    : previous_(g_forced.exchange(static_cast<int>(path))) {}

ScopedCpuGemmPath::~ScopedCpuGemmPath() {
  g_forced.store(previous_);
}

namespace gemm {
namespace {
// Widened only when every operand has the first's low-precision dtype; anything else (mixed
// dtypes, a GPU tensor) goes to ATen as given, which computes or refuses it as before.
bool widen(std::initializer_list<const at::Tensor*> operands) {
  const at::Tensor& first = **operands.begin();
  if (!widens_gemm(first)) return false;
  for (const at::Tensor* t : operands) {
    if (t->defined() && (t->scalar_type() != first.scalar_type() || !t->is_cpu())) return false;
  }
  return true;
}
bool is_transpose_of(const at::Tensor& t, const at::Tensor& of) {
  if (t.dim() < 2 || t.dim() != of.dim() || !t.is_alias_of(of)) return false;
  const at::Tensor back = t.transpose(-2, -1);
  return back.sizes() == of.sizes() && back.strides() == of.strides() &&
         back.storage_offset() == of.storage_offset();
}

// The float32 copies of a GEMM's operands, each made once: an operand that is an earlier one,
// or the transpose view of an earlier one (X and X^T in X X^T), reuses that copy. Values (and
// gradients) are those of one copy per operand; it saves the casts Newton-Schulz would repeat.
class Widener {
 public:
  at::Tensor operator()(const at::Tensor& t) {
    if (!t.defined()) return t;
    for (const auto& [original, copy] : done_) {
      if (t.is_same(original)) return copy;
      if (is_transpose_of(t, original)) return copy.transpose(-2, -1);
    }
    at::Tensor copy = at::_to_copy(t, at::TensorOptions().dtype(at::kFloat));
    done_.emplace_back(t, copy);
    return copy;
  }

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> done_;
};

// The one rounding, to the operands' dtype.
at::Tensor round_once(const at::Tensor& wide, const at::Tensor& like) {
  return at::_to_copy(wide, at::TensorOptions().dtype(like.scalar_type()));
}
}  // namespace

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  if (!widen({&a, &b})) return at::mm(a, b);
  Widener wide;
  return round_once(at::mm(wide(a), wide(b)), a);
}

at::Tensor addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) {
  if (!widen({&a, &b, &bias})) return at::addmm(bias, a, b);
  Widener wide;
  return round_once(at::addmm(wide(bias), wide(a), wide(b)), a);
}

at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  if (!widen({&a, &b})) return at::bmm(a, b);
  Widener wide;
  return round_once(at::bmm(wide(a), wide(b)), a);
}

at::Tensor baddbmm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double beta,
                   double alpha) {
  if (!widen({&a, &b, &c})) return at::baddbmm(c, a, b, beta, alpha);
  Widener wide;
  return round_once(at::baddbmm(wide(c), wide(a), wide(b), beta, alpha), a);
}

at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) {
  if (!widen({&a, &b})) return at::matmul(a, b);
  Widener wide;
  return round_once(at::matmul(wide(a), wide(b)), a);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!widen({&x, &weight, &bias})) return at::linear(x, weight, bias);
  Widener wide;
  return round_once(at::linear(wide(x), wide(weight), wide(bias)), x);
}
}  // namespace gemm

}  // namespace mixtrain
