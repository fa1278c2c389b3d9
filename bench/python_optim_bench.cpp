// mixtrain.optim against torch.optim, per step, on the ~41M-parameter Qwen2-MoE's parameters
// (issue 33; figures: bench/README.md): writes kMedium41MConfig (bench_support.h) to a work
// directory and runs bench/python_optim.py on it with the project's Python (MIXTRAIN_PYTHON),
// the package built beside the binary (<build>/python) and bench/twin (the eager model that
// makes the parameters) on PYTHONPATH. Its output is the table; its exit code is ours.
//
// Usage: bench_python_optim_bench [--steps N] [--threads 1,2] [--device cpu|cuda]
//                                 [--work-dir DIR] [--keep]
// (--device cuda: the same on the GPU; without one the script says "skipped: no CUDA device".)
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_support.h"

int main(int argc, char** argv) {
  using namespace mixtrain::bench;
  program_name() = "bench_python_optim_bench";
  std::string steps = "5", threads = "1,2", device = "cpu", work_base;
  bool keep = false;
  parse_arguments(argc, argv,
                  "[--steps N] [--threads 1,2] [--device cpu|cuda] [--work-dir DIR] [--keep]\n",
                  nullptr, work_base, keep, [&](const std::string& arg, const auto& value) {
                    if (arg == "--steps") {
                      steps = std::to_string(int_at_least(value(), "--steps", 1));
                    } else if (arg == "--threads") {
                      threads = value();
                    } else if (arg == "--device") {
                      device = value();
                    } else {
                      return false;
                    }
                    return true;
                  });
  const std::string work = make_work_dir(work_base, "mixtrain-python-optim");
  const std::string config = work + "/medium_41m.yaml";
  std::ofstream(config) << kMedium41MConfig;
  const std::string package = std::filesystem::path(MIXTRAIN_BINARY).parent_path() / "python";
  const std::string path = package + ":" + MIXTRAIN_SOURCE_DIR + "/bench/twin";
  setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<std::string> args = {MIXTRAIN_PYTHON,
                                   std::string(MIXTRAIN_SOURCE_DIR) + "/bench/python_optim.py"};
  for (const std::string& arg :
       {std::string("--config"), config, std::string("--steps"), steps, std::string("--threads"),
        threads, std::string("--device"), device}) {
    args.push_back(arg);
  }
  std::vector<char*> raw;
  for (std::string& arg : args) raw.push_back(arg.data());
  raw.push_back(nullptr);
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) fail("fork failed");
  if (child == 0) {
    execv(raw[0], raw.data());
    std::perror(raw[0]);
    _exit(127);
  }
  int status = 0;
  waitpid(child, &status, 0);
  keep_or_remove(work, keep, "work directory kept: ");
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (code != 0) fail("bench/python_optim.py exited " + std::to_string(code));
  return 0;
}
