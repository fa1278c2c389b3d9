// Start-up check of the BLAS that LibTorch's float32 GEMM resolves to.
//
// Without OpenBLAS, Debian's LibTorch falls back to the reference BLAS and fp32 GEMM runs about
// 20x slower (docs/architecture.md §1). The check finds the library that really provides `sgemm_`
// in this process and warns once when it is not OpenBLAS; it never fails a run.
#pragma once

#include <string>

namespace mixtrain {

struct BlasInfo {
  std::string library;  // resolved path of the shared object providing sgemm_ ("" if none)
  bool is_openblas = false;
};

BlasInfo detect_blas();

// Logs the BLAS in use at debug level, or a warning naming the fix when it is not OpenBLAS.
void warn_if_reference_blas();

}  // namespace mixtrain
