// support/python_script.h: a script run through the shared interpreter
// (tests/python/script_server.py) behaves as `python SCRIPT ARG... > OUT 2> ERR` would: the same
// exit code for a normal end, sys.exit(N), sys.exit("message") and an uncaught exception, its
// argv, its own output files, fresh module globals each run; one interpreter serves the runs of
// a process, a forked child starts its own, and a server that dies is replaced.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "support/python_script.h"
#include "support/scoped_temp_dir.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

using test_support::python_script_succeeds;
using test_support::run_python_script;
using test_support::ScopedTempDir;

std::string slurp(const std::string& path) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

std::string write_script(const ScopedTempDir& dir, const std::string& name,
                         const std::string& body) {
  std::ofstream(dir.file(name)) << "import os, sys\n" << body;
  return dir.file(name);
}

TEST(PythonScript, ExitCodesAndOutputAreThoseOfAPythonRun) {
  const ScopedTempDir dir("python_script.");
  const std::string out = dir.file("out"), err = dir.file("err");
  const std::string talk = write_script(dir, "talk.py",
                                        "print('to stdout', sys.argv[1:])\n"
                                        "print('to stderr', file=sys.stderr)\n");
  EXPECT_EQ(run_python_script({talk, "a b", "c"}, out, err), 0);
  EXPECT_EQ(slurp(out), "to stdout ['a b', 'c']\n");
  EXPECT_EQ(slurp(err), "to stderr\n");
  EXPECT_EQ(run_python_script({talk, "x"}, out), 0);  // both into one file
  EXPECT_NE(slurp(out).find("to stdout ['x']\n"), std::string::npos) << slurp(out);
  EXPECT_NE(slurp(out).find("to stderr\n"), std::string::npos) << slurp(out);

  EXPECT_EQ(run_python_script({write_script(dir, "three.py", "sys.exit(3)\n")}, out), 3);
  EXPECT_EQ(run_python_script({write_script(dir, "none.py", "sys.exit()\n")}, out), 0);
  EXPECT_EQ(run_python_script({write_script(dir, "message.py", "sys.exit('FAIL: why')\n")}, out),
            1);
  EXPECT_EQ(slurp(out), "FAIL: why\n");
  EXPECT_EQ(run_python_script({write_script(dir, "raise.py", "raise ValueError('boom')\n")}, out),
            1);
  EXPECT_NE(slurp(out).find("Traceback"), std::string::npos) << slurp(out);
  EXPECT_NE(slurp(out).find("ValueError: boom"), std::string::npos) << slurp(out);
}

TEST(PythonScript, OneInterpreterPerProcessFreshGlobalsPerRun) {
  const ScopedTempDir dir("python_script.");
  const std::string out = dir.file("out");
  // A global a previous run set would show; the pid is the interpreter's.
  const std::string state = write_script(dir, "state.py",
                                         "print(globals().get('seen', 'fresh'), os.getpid())\n"
                                         "seen = 'stale'\n");
  ASSERT_EQ(run_python_script({state}, out), 0);
  const std::string first = slurp(out);
  ASSERT_EQ(run_python_script({state}, out), 0);
  EXPECT_EQ(slurp(out), first) << "another interpreter, or globals kept from the first run";
  EXPECT_EQ(first.rfind("fresh ", 0), 0u) << first;

  // A forked child does not write to its parent's server: it starts its own.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int code = run_python_script({state}, dir.file("child"));
    _exit(code == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_NE(slurp(dir.file("child")), first) << "the child used its parent's interpreter";
  ASSERT_EQ(run_python_script({state}, out), 0);
  EXPECT_EQ(slurp(out), first) << "the parent's server did not survive the child";
}

TEST(PythonScript, AServerThatDiesIsReplaced) {
  const ScopedTempDir dir("python_script.");
  const std::string out = dir.file("out");
  const std::string pid = write_script(dir, "pid.py", "print(os.getpid())\n");
  ASSERT_EQ(run_python_script({pid}, out), 0);
  const std::string before = slurp(out);
  EXPECT_EQ(run_python_script({write_script(dir, "die.py", "os._exit(9)\n")}, out), -1);
  ASSERT_EQ(run_python_script({pid}, out), 0);
  EXPECT_NE(slurp(out), before);
}

std::string g_failing_script;  // EXPECT_NONFATAL_FAILURE's statement cannot use locals

TEST(PythonScript, AFailedRunReportsTheCommandAndItsOutput) {
  const ScopedTempDir dir("python_script.");
  g_failing_script = write_script(dir, "fail.py", "print('the reason')\nsys.exit(2)\n");
  EXPECT_NONFATAL_FAILURE(python_script_succeeds({g_failing_script, "arg"}),
                          "fail.py' 'arg' exited 2:\nthe reason");
  EXPECT_TRUE(python_script_succeeds({write_script(dir, "ok.py", "pass\n")}));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
