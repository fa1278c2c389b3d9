// Running one gtest at every CPU capability, with ATen and our kernels on the same one.
//
// ATen reads its capability (ATEN_CPU_CAPABILITY) once per process, so a bitwise comparison
// between a fused kernel and ATen's unfused ops at another capability needs a process of its own.
// expect_passes_at_every_capability(test) reruns this test binary once per capability the CPU
// has, filtered to `test`, with ATEN_CPU_CAPABILITY and MIXTRAIN_CPU_CAPABILITY set to it. That
// test must start with MIXTRAIN_ANNOUNCE_CAPABILITY_OR_SKIP(); the parent then demands, per
// capability, exit 0, exactly one test run and passed, none skipped, and the "capability: NAME"
// line (a filter that matches nothing, or a skip, also exits 0).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <regex>
#include <string>

#include "mixtrain/core/cpu_capability.h"
#include "support/child_process.h"

namespace mixtrain::testing {

// True when ATen (ATEN_CPU_CAPABILITY) and we (MIXTRAIN_CPU_CAPABILITY) run the same
// capability. Unset, each takes the best the CPU has.
inline bool same_capability_as_aten() {
  const char* aten = std::getenv("ATEN_CPU_CAPABILITY");
  const std::string aten_name =
      aten != nullptr && *aten != '\0' ? aten : cpu_capability_name(hardware_cpu_capability());
  return aten_name == cpu_capability_name(cpu_capability());
}

// The number of tests gtest says it ran ("[==========] N test(s) from M test suite(s) ran."),
// -1 without that line.
inline int tests_ran(const std::string& output) {
  static const std::regex line(R"(\[==========\] (\d+) tests? from \d+ test suites? ran\.)");
  std::smatch match;
  return std::regex_search(output, match, line) ? std::stoi(match[1]) : -1;
}

inline void expect_passes_at_every_capability(const std::string& test) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(len, 0);
  self[len] = '\0';
  for (int c = 0; c <= static_cast<int>(hardware_cpu_capability()); ++c) {
    const std::string name = cpu_capability_name(static_cast<CpuCapability>(c));
    ChildOptions options;
    options.capture_output = true;
    options.env = {{"ATEN_CPU_CAPABILITY", name}, {"MIXTRAIN_CPU_CAPABILITY", name}};
    ChildProcess child({self, "--gtest_color=no", "--gtest_filter=" + test}, options);
    const std::string output = child.read_output();
    const int exit_code = exit_code_of(child.wait());
    const int ran = tests_ran(output);
    std::cout << "capability " << name << ": child ran " << ran << " test(s), exit " << exit_code
              << "\n";
    EXPECT_EQ(exit_code, 0) << "capability " << name << ":\n" << output;
    EXPECT_EQ(ran, 1) << "capability " << name << ":\n" << output;
    EXPECT_NE(output.find("[  PASSED  ] 1 test."), std::string::npos) << output;
    EXPECT_EQ(output.find("SKIPPED"), std::string::npos) << output;
    EXPECT_NE(output.find("capability: " + name + "\n"), std::string::npos) << output;
  }
}

}  // namespace mixtrain::testing

// For the test a child runs: skips it unless ATen and we run the same capability (a direct run
// of the whole binary with only one of the variables set), else prints "capability: NAME".
#define MIXTRAIN_ANNOUNCE_CAPABILITY_OR_SKIP()                                                   \
  do {                                                                                           \
    if (!::mixtrain::testing::same_capability_as_aten()) {                                       \
      GTEST_SKIP() << "ATEN_CPU_CAPABILITY and MIXTRAIN_CPU_CAPABILITY differ";                  \
    }                                                                                            \
    std::cout << "capability: " << ::mixtrain::cpu_capability_name(::mixtrain::cpu_capability()) \
              << "\n";                                                                           \
  } while (0)
