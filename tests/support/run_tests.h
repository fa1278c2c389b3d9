// The body of main() of every test executable (test_main.cpp, cuda_test_main.cpp). One
// executable holds the tests of one folder (tests/tests.cmake); CTest runs it once per test file
// with --test_file=tests/<folder>/<name>.cpp, which selects the tests defined in that file (by
// gtest's TestInfo::file(), the path the compiler was given). A --test_file that selects no test
// is an error (exit 1), so a renamed or emptied file cannot pass as "0 tests". Without
// --test_file every test of the executable runs; --gtest_filter works as usual, but not
// together with --test_file (refused: one selection at a time).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace mixtrain::testing {

inline bool ends_with_path(const std::string& path, const std::string& suffix) {
  return path.size() > suffix.size() &&
         path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0 &&
         path[path.size() - suffix.size() - 1] == '/';
}

inline int run_selected_tests(int argc, char** argv) {
  std::string test_file;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strncmp(argv[i], "--test_file=", 12) == 0) {
      test_file = argv[i] + 12;
    } else {
      args.push_back(argv[i]);
    }
  }
  int count = static_cast<int>(args.size());
  args.push_back(nullptr);
  ::testing::InitGoogleTest(&count, args.data());
  if (!test_file.empty()) {
    if (GTEST_FLAG_GET(filter) != "*") {
      std::fprintf(stderr, "--test_file and --gtest_filter select tests both: give one\n");
      return 1;
    }
    std::string filter;
    const ::testing::UnitTest& tests = *::testing::UnitTest::GetInstance();
    for (int s = 0; s < tests.total_test_suite_count(); ++s) {
      const ::testing::TestSuite& suite = *tests.GetTestSuite(s);
      for (int t = 0; t < suite.total_test_count(); ++t) {
        const ::testing::TestInfo& info = *suite.GetTestInfo(t);
        if (!ends_with_path(info.file(), test_file)) continue;
        if (!filter.empty()) filter += ':';
        filter += std::string(info.test_suite_name()) + "." + info.name();
      }
    }
    if (filter.empty()) {
      std::fprintf(stderr, "--test_file=%s: no test of this executable is defined there\n",
                   test_file.c_str());
      return 1;
    }
    GTEST_FLAG_SET(filter, filter);
  }
  return RUN_ALL_TESTS();
}

}  // namespace mixtrain::testing
