// Runs a tests/python script as `MIXTRAIN_PYTHON SCRIPT ARG... > OUTPUT 2> ERRORS` would, but all
// the runs of one test process share one interpreter (tests/python/script_server.py): starting
// Python and importing torch and transformers costs 2-4 s a run on the 2-core development VM,
// and some tests run a reference a dozen times.
//
//   ASSERT_TRUE(python_script_succeeds({"hf_models.py", "save", "qwen2", dir, reference}));
//
// SCRIPT without a '/' is tests/python/SCRIPT. The server starts at the first run (in each
// process: a forked worker gets its own), reads requests on a pipe and dies with the test process
// (end of input, or its death signal). A server that dies makes the run return -1 (its stderr
// is passed on to the test's) and the next run starts a fresh one.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/child_process.h"

namespace mixtrain::test_support {

inline std::string python_script_path(const std::string& script) {
  if (script.find('/') != std::string::npos) return script;
  return std::string(MIXTRAIN_SOURCE_DIR) + "/tests/python/" + script;
}

// The shell command the run stands for (for failure messages and a rerun by hand).
inline std::string python_script_command(const std::vector<std::string>& argv) {
  std::string command = std::string("'") + MIXTRAIN_PYTHON + "'";
  for (size_t i = 0; i < argv.size(); ++i) {
    command += " '" + (i == 0 ? python_script_path(argv[0]) : argv[i]) + "'";
  }
  return command;
}

// The script's exit code (what the interpreter would exit with), or -1 when the server died.
// Its stdout goes to `output`, its stderr to `errors` ("": to `output` too).
inline int run_python_script(std::vector<std::string> argv, const std::string& output,
                             const std::string& errors = "") {
  struct Server {
    pid_t owner = -1;
    testing::ChildProcess* process = nullptr;  // never deleted: see the header comment
  };
  static Server* server = new Server;
  if (server->owner != getpid()) {  // first run, or a forked child holding its parent's server
    server->process = nullptr;
    server->owner = getpid();
  }
  if (server->process == nullptr) {
    testing::ChildOptions options;
    options.capture_output = true;
    options.pipe_input = true;
    server->process = new testing::ChildProcess(
        {MIXTRAIN_PYTHON, python_script_path("script_server.py")}, options);
  }
  argv.at(0) = python_script_path(argv.at(0));
  nlohmann::json request = {{"argv", argv}, {"output", output}};
  if (!errors.empty()) request["errors"] = errors;
  if (server->process->write_input(request.dump() + "\n")) {
    while (const auto line = server->process->read_line()) {
      if (line->rfind("exit ", 0) == 0) return std::stoi(line->substr(5));
      std::cerr << *line << "\n";  // the server's own complaint
    }
  }
  std::cerr << "tests/python/script_server.py ended while running " << argv[0] << "\n";
  delete server->process;  // reaps it
  server->process = nullptr;
  return -1;
}

// Runs the script with its output into a temporary file; when it exits non-zero, one gtest
// failure with the command and that output. True when it exited 0.
inline bool python_script_succeeds(const std::vector<std::string>& argv) {
  std::string path = (std::filesystem::temp_directory_path() / "python_script.XXXXXX").string();
  const int fd = mkstemp(path.data());
  if (fd < 0) {
    ADD_FAILURE() << "mkstemp " << path << " failed";
    return false;
  }
  close(fd);
  const int code = run_python_script(argv, path);
  if (code != 0) {
    std::stringstream output;
    output << std::ifstream(path).rdbuf();
    ADD_FAILURE() << python_script_command(argv) << " exited " << code << ":\n" << output.str();
  }
  std::filesystem::remove(path);
  return code == 0;
}

}  // namespace mixtrain::test_support
