// The capability rule: hardware detection, the MIXTRAIN_CPU_CAPABILITY override (lowers,
// never raises; unknown names are config errors). That each variant computes the same as
// DEFAULT, and that the AVX-512 build is really 16 floats wide, is checked on a real kernel in
// tests/unit/optim/sum_of_squares_kernel_test.cpp (kernels live in their modules, and this
// test links mixtrain_core only).
#include "mixtrain/core/cpu_capability.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(CpuCapabilityTest, NamesAreTheOverrideSpellings) {
  EXPECT_STREQ(cpu_capability_name(CpuCapability::kDefault), "default");
  EXPECT_STREQ(cpu_capability_name(CpuCapability::kAvx2), "avx2");
  EXPECT_STREQ(cpu_capability_name(CpuCapability::kAvx512), "avx512");
}

TEST(CpuCapabilityTest, HardwareDetectionAgreesWithCpuid) {
  const CpuCapability hardware = hardware_cpu_capability();
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  EXPECT_EQ(hardware == CpuCapability::kAvx512, avx512);
  if (hardware == CpuCapability::kAvx2) {
    EXPECT_TRUE(avx2);
  }
  if (hardware == CpuCapability::kDefault) {
    EXPECT_FALSE(avx2);
  }
}

TEST(CpuCapabilityTest, NoOverrideKeepsTheHardwareCapability) {
  for (auto hw : {CpuCapability::kDefault, CpuCapability::kAvx2, CpuCapability::kAvx512}) {
    EXPECT_EQ(resolve_cpu_capability(hw, nullptr), hw);
    EXPECT_EQ(resolve_cpu_capability(hw, ""), hw);
  }
}

TEST(CpuCapabilityTest, OverrideLowersTheCapability) {
  EXPECT_EQ(resolve_cpu_capability(CpuCapability::kAvx512, "default"), CpuCapability::kDefault);
  EXPECT_EQ(resolve_cpu_capability(CpuCapability::kAvx512, "avx2"), CpuCapability::kAvx2);
  EXPECT_EQ(resolve_cpu_capability(CpuCapability::kAvx512, "avx512"), CpuCapability::kAvx512);
  EXPECT_EQ(resolve_cpu_capability(CpuCapability::kAvx2, "default"), CpuCapability::kDefault);
}

TEST(CpuCapabilityTest, OverrideNeverRaisesAboveTheHardwareAndWarns) {
  const int warnings = warning_count();
  EXPECT_EQ(resolve_cpu_capability(CpuCapability::kAvx2, "avx512"), CpuCapability::kAvx2);
  EXPECT_EQ(resolve_cpu_capability(CpuCapability::kDefault, "avx2"), CpuCapability::kDefault);
  EXPECT_EQ(warning_count(), warnings + 2);
}

TEST(CpuCapabilityTest, UnknownOverrideIsAConfigErrorNamingTheVariable) {
  try {
    resolve_cpu_capability(CpuCapability::kAvx512, "sse4");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MIXTRAIN_CPU_CAPABILITY"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("sse4"), std::string::npos);
  }
}

TEST(CpuCapabilityTest, ProcessCapabilityFollowsTheRule) {
  EXPECT_EQ(cpu_capability(), resolve_cpu_capability(hardware_cpu_capability(),
                                                     std::getenv("MIXTRAIN_CPU_CAPABILITY")));
  EXPECT_LE(cpu_capability(), hardware_cpu_capability());
}

TEST(CpuCapabilityTest, SelectKernelPicksTheVariantOfTheProcessCapability) {
  const int picked = select_kernel<int>(0, 1, 2);
  EXPECT_EQ(picked, static_cast<int>(cpu_capability()));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
