#include "mixtrain/core/blas_check.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include "mixtrain/core/logging.h"

namespace mixtrain {

BlasInfo detect_blas() {
  BlasInfo info;
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info where{};
  if (sgemm == nullptr || dladdr(sgemm, &where) == 0 || where.dli_fname == nullptr) return info;
  // Debian selects the BLAS through update-alternatives symlinks: resolve them to see which.
  char resolved[PATH_MAX];
  info.library = realpath(where.dli_fname, resolved) ? resolved : where.dli_fname;
  info.is_openblas = info.library.find("openblas") != std::string::npos ||
                     dlsym(RTLD_DEFAULT, "openblas_get_config") != nullptr;
  return info;
}

void warn_if_reference_blas() {
  BlasInfo info = detect_blas();
  if (info.is_openblas) {
    log_debug("fp32 GEMM uses OpenBLAS: " + info.library);
    return;
  }
  log_warn("fp32 GEMM falls back to the reference BLAS (" +
           (info.library.empty() ? std::string("sgemm_ not found") : info.library) +
           "), about 20x slower: install libopenblas0-pthread (scripts/setup.sh does) and select "
           "it with update-alternatives --config libblas.so.3-x86_64-linux-gnu");
}

}  // namespace mixtrain
