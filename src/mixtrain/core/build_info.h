// What this binary is and what it runs on, for `mixtrain version` and the top of every run's
// log: mixtrain's version and commit, which kind of build it is (CUDA or CPU-only, and why: the
// configure-time decision of cmake/torch.cmake), the LibTorch it was built against and runs with,
// LibTorch's CUDA (loaded, devices visible), the CPU, its class and the capability our kernels
// picked, how bf16/fp16 GEMMs run on it (core/cpu_gemm.h), and LibTorch's BLAS. The BLAS is a build
// property of LibTorch (the torch wheel links MKL in); a LibTorch without an optimized BLAS
// (BLAS_INFO absent or "generic") runs float32 GEMM many times slower: warned.
#pragma once

#include <string>

namespace mixtrain {

struct BuildInfo {
  std::string version;          // mixtrain's (CMake project version)
  std::string commit;           // git commit at configure time, "unknown" outside a checkout
  std::string kind;             // "CUDA 13.0 (...)" or "CPU-only (<why>)": MIXTRAIN_CUDA's outcome
  std::string libtorch;         // TORCH_VERSION of the headers built against
  bool cuda_compiled = false;   // LibTorch's CUDA loaded (never in a CPU-only build)
  int cuda_devices = 0;         // CUDA devices visible to this process
  std::string cpu_capability;   // our kernels' pick (core/cpu_capability)
  std::string aten_capability;  // ATen's own pick
  std::string blas;             // BLAS_INFO of LibTorch's build configuration ("" if none)
  std::string cpu_name;         // cpuinfo's name of the CPU
  std::string cpu_gemm;         // core/cpu_gemm's choice for bf16 and fp16 GEMMs, and why
};

BuildInfo build_info();

// Whether this binary has the CUDA kernels and NCCL (a CUDA build; MIXTRAIN_WITH_CUDA).
constexpr bool built_with_cuda() {
  return MIXTRAIN_WITH_CUDA != 0;
}

// The one line a CPU-only build answers `train.device: cuda` with: what this build is and how
// to get one with CUDA.
std::string no_cuda_build_message();

// "BLAS_INFO=mkl, ..." -> "mkl": the value of `key` in LibTorch's show_config() text.
std::string config_value(const std::string& show_config, const std::string& key);

// Whether LibTorch's BLAS is an optimized one (not absent, "generic" or "eigen").
bool is_optimized_blas(const std::string& blas);

// Multi-line text for `mixtrain version` and the run log.
std::string format_build_info(const BuildInfo& info);

// Warns once when LibTorch has no optimized BLAS.
void warn_if_reference_blas();

}  // namespace mixtrain
