#include "mixtrain/core/blas_check.h"

#include <gtest/gtest.h>

namespace mixtrain {
namespace {

// scripts/setup.sh installs libopenblas0-pthread, whose libblas.so.3 alternative has the
// highest priority, so LibTorch's sgemm_ must resolve into OpenBLAS on a set-up machine.
TEST(BlasCheck, SgemmResolvesToOpenBlasOnASetUpMachine) {
  BlasInfo info = detect_blas();
  ASSERT_FALSE(info.library.empty()) << "sgemm_ not found in the process";
  EXPECT_TRUE(info.is_openblas) << info.library;
}

}  // namespace
}  // namespace mixtrain
