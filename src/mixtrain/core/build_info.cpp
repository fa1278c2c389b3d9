#include "mixtrain/core/build_info.h"

#include <ATen/Version.h>
#include <ATen/cpu/Utils.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#include "mixtrain/core/cpu_capability.h"
#include "mixtrain/core/cpu_gemm.h"
#include "mixtrain/core/logging.h"

#ifndef MIXTRAIN_VERSION
#define MIXTRAIN_VERSION "unknown"
#endif
#ifndef MIXTRAIN_COMMIT
#define MIXTRAIN_COMMIT "unknown"
#endif
#ifndef MIXTRAIN_BUILD_KIND
#define MIXTRAIN_BUILD_KIND "unknown"
#endif

namespace mixtrain {

std::string config_value(const std::string& show_config, const std::string& key) {
  const std::string needle = key + "=";
  size_t at = show_config.find(needle);
  // A match must start a field: after a space, a comma or the start of the text.
  while (at != std::string::npos && at > 0 && show_config[at - 1] != ' ' &&
         show_config[at - 1] != ',') {
    at = show_config.find(needle, at + 1);
  }
  if (at == std::string::npos) return "";
  const size_t begin = at + needle.size();
  const size_t end = show_config.find_first_of(",\n", begin);
  return show_config.substr(begin, end == std::string::npos ? end : end - begin);
}

bool is_optimized_blas(const std::string& blas) {
  return !blas.empty() && blas != "generic" && blas != "eigen";
}

BuildInfo build_info() {
  BuildInfo info;
  info.version = MIXTRAIN_VERSION;
  info.commit = MIXTRAIN_COMMIT;
  info.kind = MIXTRAIN_BUILD_KIND;
  info.libtorch = TORCH_VERSION;
  const at::CUDAHooksInterface& cuda = at::detail::getCUDAHooks();
  info.cuda_compiled = cuda.isBuilt();
  info.cuda_devices = cuda.isAvailable() ? cuda.deviceCount() : 0;
  info.cpu_capability = cpu_capability_name(cpu_capability());
  info.aten_capability = at::get_cpu_capability();
  info.blas = config_value(at::show_config(), "BLAS_INFO");
  const auto caps = at::cpu::get_cpu_capabilities();
  const auto name = caps.find("cpu_name");
  info.cpu_name = name != caps.end() && name->second.isString() ? name->second.toStringRef()
                                                                : std::string("unknown");
  info.cpu_gemm = cpu_gemm_summary();
  return info;
}

std::string format_build_info(const BuildInfo& info) {
  return "mixtrain " + info.version + " (commit " + info.commit + ")\n" + "Build: " + info.kind +
         "\n" + "LibTorch " + info.libtorch + "\n" +
         "CUDA: " + (info.cuda_compiled ? "compiled in" : "not compiled in") + ", " +
         std::to_string(info.cuda_devices) + " device(s) visible\n" + "CPU: " + info.cpu_name +
         "\n" + "CPU capability: " + info.cpu_capability + " (our kernels), " +
         info.aten_capability + " (ATen)\n" + "CPU GEMM: " + info.cpu_gemm + "\n" +
         "BLAS: " + (info.blas.empty() ? "none" : info.blas) + "\n";
}

std::string no_cuda_build_message() {
  return std::string("this mixtrain build is ") + MIXTRAIN_BUILD_KIND +
         " and cannot use a GPU; use cpu, or build on a machine with the CUDA toolkit "
         "(nvcc on PATH; `cmake -DMIXTRAIN_CUDA=ON`, docs/development.md)";
}

void warn_if_reference_blas() {
  const std::string blas = config_value(at::show_config(), "BLAS_INFO");
  if (is_optimized_blas(blas)) return;
  log_warn("LibTorch was built without an optimized BLAS (BLAS_INFO=" +
           (blas.empty() ? std::string("none") : blas) +
           "): float32 GEMM runs many times slower; use the torch wheel scripts/setup.sh installs");
}

}  // namespace mixtrain
