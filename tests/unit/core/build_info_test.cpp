#include "mixtrain/core/build_info.h"

#include <ATen/Version.h>
#include <gtest/gtest.h>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(BuildInfo, ConfigValueReadsOneFieldOfShowConfig) {
  const std::string text =
      "  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, CUDA_VERSION=13.0, "
      "LAPACK_INFO=mkl, TORCH_VERSION=2.11.0, \n";
  EXPECT_EQ(config_value(text, "BLAS_INFO"), "mkl");
  EXPECT_EQ(config_value(text, "TORCH_VERSION"), "2.11.0");
  EXPECT_EQ(config_value(text, "CUDA_VERSION"), "13.0");
  EXPECT_EQ(config_value(text, "INFO"), "");  // only whole field names match
  EXPECT_EQ(config_value(text, "USE_MPI"), "");
  EXPECT_EQ(config_value("BLAS_INFO=open", "BLAS_INFO"), "open");
}

TEST(BuildInfo, OptimizedBlas) {
  EXPECT_TRUE(is_optimized_blas("mkl"));
  EXPECT_TRUE(is_optimized_blas("open"));
  EXPECT_FALSE(is_optimized_blas(""));
  EXPECT_FALSE(is_optimized_blas("generic"));
}

// The LibTorch this project builds against (scripts/setup.sh: the torch wheel, >= 2.11, MKL).
TEST(BuildInfo, DescribesTheLibTorchWeRunWith) {
  const BuildInfo info = build_info();
  EXPECT_EQ(info.libtorch.rfind("2.", 0), 0u) << info.libtorch;
  EXPECT_GE(std::stoi(info.libtorch.substr(2)), 11) << info.libtorch;
  EXPECT_TRUE(is_optimized_blas(info.blas)) << info.blas;
  EXPECT_EQ(info.aten_capability, at::get_cpu_capability());
  EXPECT_FALSE(info.version.empty());
  const std::string text = format_build_info(info);
  EXPECT_NE(text.find("LibTorch " + info.libtorch), std::string::npos) << text;
  EXPECT_NE(text.find("BLAS: " + info.blas), std::string::npos) << text;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
