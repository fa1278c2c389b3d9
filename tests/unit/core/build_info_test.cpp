#include "mixtrain/core/build_info.h"

#include <ATen/Version.h>
#include <gtest/gtest.h>
#include <link.h>

#include <string>
#include <vector>

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

// The C++ runtime is the shared libstdc++.so.6, loaded before LibTorch (CMakeLists.txt): the
// loader loads a binary's libraries in the order it names them, so libstdc++ must come before
// any libtorch* or libc10*. A compiler without a shared libstdc++ of its own would otherwise link
// a static copy beside the shared one LibTorch brings (file streams crashed between the two).
TEST(BuildInfo, TheSharedCxxRuntimeIsLoadedBeforeLibTorch) {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        static_cast<std::vector<std::string>*>(out)->push_back(info->dlpi_name ? info->dlpi_name
                                                                               : "");
        return 0;
      },
      &names);
  auto first = [&](const std::string& part) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i].find(part) != std::string::npos) return i;
    }
    return names.size();
  };
  std::string all;
  for (const std::string& n : names) all += n + "\n";
  const size_t libstdcxx = first("/libstdc++.so");
  ASSERT_LT(libstdcxx, names.size()) << "no shared libstdc++ loaded:\n" << all;
  EXPECT_LT(libstdcxx, first("/libtorch")) << all;
  EXPECT_LT(libstdcxx, first("/libc10")) << all;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
