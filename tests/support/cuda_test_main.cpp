// main() of the CUDA tests (tests/**/*_cuda_test.cpp, label cuda; one executable per folder,
// selected per file: support/run_tests.h). Without a usable CUDA device
// it prints why and exits 77, which CTest reports as "Skipped" (SKIP_RETURN_CODE), never as
// passed. MIXTRAIN_REQUIRE_CUDA=1 (scripts/device_check.sh sets it on a GPU machine) turns that
// into a failure, so a broken driver there cannot pass as a skip; and so is a test that skips
// itself (GTEST_SKIP, e.g. for a CPU without AVX2), which gtest would count as passed.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "support/run_tests.h"

int main(int argc, char** argv) {
  const char* require_flag = std::getenv("MIXTRAIN_REQUIRE_CUDA");
  const bool require = require_flag != nullptr && std::strcmp(require_flag, "1") == 0;
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    const char* reason = status != cudaSuccess ? cudaGetErrorString(status) : "0 devices";
    if (require) {
      std::fprintf(stderr, "FAILED: no CUDA device (%s) and MIXTRAIN_REQUIRE_CUDA=1\n", reason);
      return 1;
    }
    std::printf("skipped: no CUDA device (%s)\n", reason);
    return 77;
  }
  const int result = mixtrain::testing::run_selected_tests(argc, argv);
  const int skipped = ::testing::UnitTest::GetInstance()->skipped_test_count();
  if (result == 0 && require && skipped > 0) {
    std::fprintf(stderr, "FAILED: %d test(s) skipped themselves and MIXTRAIN_REQUIRE_CUDA=1\n",
                 skipped);
    return 1;
  }
  return result;
}
