// How the engine computes a bfloat16 or float16 GEMM on the CPU: the one place that decides
// (docs/architecture.md §1, "Low-precision GEMMs on the CPU").
//
// Two paths. Native: ATen's own bf16/fp16 kernel (oneDNN), fast where the CPU has the
// instructions. Widened: both operands widened to float32, one float32 GEMM, the result rounded
// once to the operands' dtype. A product of two bf16 (or two fp16) numbers is exact in float32,
// so the two paths differ only in the order of their float32 sums (and in rare subnormal
// products, which oneDNN flushes). Without native instructions ATen's low-precision GEMMs leave
// oneDNN for a generic loop ~100x below the float32 rate, so there the widened path is taken.
//
// The choice is made once per process from the CPU (at::cpu::get_cpu_capabilities, lowered by
// ONEDNN_MAX_CPU_ISA as oneDNN itself is, and by ATen's mkldnn switch); MIXTRAIN_CPU_GEMM=
// auto|native|widened overrides it for both dtypes. Float32, float64 and every GPU tensor go
// to ATen unchanged whatever the choice.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace mixtrain {

enum class CpuGemmPath { kNative, kWidened };

// The CPU features the rule reads (cpuinfo's names), and oneDNN's ceiling.
struct CpuGemmFeatures {
  bool avx512_core = false;  // avx512 f, bw, vl, dq
  bool avx512_bf16 = false, amx_bf16 = false;
  bool avx512_fp16 = false, amx_fp16 = false;
  bool avx2 = false;
  bool mkldnn_enabled = true;  // ATen's switch (torch.backends.mkldnn.enabled)
  std::string onednn_max_isa;  // ONEDNN_MAX_CPU_ISA, "" when unset
};

struct CpuGemmChoice {
  CpuGemmPath bf16 = CpuGemmPath::kNative;
  CpuGemmPath fp16 = CpuGemmPath::kNative;
  std::string cpu_class;  // "amx", "avx512-bf16", "avx512", "avx2", "other"
  std::string reason;     // why, in a few words
};

// The pure rule. `requested`: MIXTRAIN_CPU_GEMM's value (nullptr or "" = auto); an unknown
// value is a ConfigError naming the variable.
CpuGemmChoice decide_cpu_gemm(const CpuGemmFeatures& features, const char* requested);

// This CPU's features and the environment's ceiling.
CpuGemmFeatures detect_cpu_gemm_features();

// The process's choice (decided at the first call, then fixed), unless a ScopedCpuGemmPath is
// alive. Throws ConfigError for a bad MIXTRAIN_CPU_GEMM.
const CpuGemmChoice& cpu_gemm_choice();
CpuGemmPath cpu_gemm_path(c10::ScalarType dtype);  // kNative for every other dtype

// "bf16 native, fp16 widened (avx512-bf16: ...)": for `mixtrain version` and the run log.
std::string cpu_gemm_summary();
const char* cpu_gemm_path_name(CpuGemmPath path);

// True when a GEMM on `operand` (a CPU bf16/fp16 tensor) takes the widened path.
bool widens_gemm(const at::Tensor& operand);

// Tests and benches: forces one path for both dtypes in this process while alive (not
// thread-safe against GEMMs running meanwhile on other threads; nests).
class ScopedCpuGemmPath {
 public:
  explicit ScopedCpuGemmPath(CpuGemmPath path);
  ~ScopedCpuGemmPath();
  ScopedCpuGemmPath(const ScopedCpuGemmPath&) = delete;
  ScopedCpuGemmPath& operator=(const ScopedCpuGemmPath&) = delete;

 private:
  int previous_;
};

// ATen's GEMMs, through the choice: the same arguments and results (autograd included); on the
// widened path the operands are widened, ATen runs the float32 op, the result is rounded once.
// A backward pass does the same: the cast's gradient rounds the float32 gradient once.
namespace gemm {
at::Tensor mm(const at::Tensor& a, const at::Tensor& b);
at::Tensor addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b);
at::Tensor bmm(const at::Tensor& a, const at::Tensor& b);
at::Tensor baddbmm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double beta,
                   double alpha);
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b);
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
}  // namespace gemm

}  // namespace mixtrain
