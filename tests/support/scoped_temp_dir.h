// A fresh directory for one test, removed with everything in it when the object goes out of
// scope: also when an ASSERT_* or FAIL() returns from the test early or an exception unwinds it,
// so a failing test leaves nothing under the temp directory. mkdtemp names it uniquely
// (prefix + 6 random characters), so tests running in parallel (ctest -j) never share one.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace mixtrain::test_support {

class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp failed for " + pattern);
    }
    path_ = pattern;
  }
  ~ScopedTempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace mixtrain::test_support
