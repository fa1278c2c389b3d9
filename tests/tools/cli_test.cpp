// The command line itself (cli/cli.cpp): a word that names no command is an error with the
// nearest command, exit 2, at every level and also with --help; real commands still parse.
// Errors a build step raises about a config key reach the user with the key as they wrote it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "mixtrain/core/build_info.h"
#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(Cli, TypoedCommandNamesTheNearestCommand) {
  const CommandResult r = run_mixtrain("trian --config x.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "mixtrain: unknown command 'trian' (did you mean 'train'?)"))
      << r.output;
  EXPECT_TRUE(contains(
      r.output, "commands: train, optim-replay, eval, config, ckpt, data, export-hf, version"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "A subcommand is required")) << r.output;
}

// `mixtrain version` names the kind of build (CUDA, or CPU-only and why), LibTorch >= 2.11 (the
// wheel scripts/setup.sh installs), whether LibTorch's CUDA is loaded, the CPU capability and
// the BLAS; no run starts.
TEST(Cli, VersionNamesLibTorchCudaCapabilityAndBlas) {
  const CommandResult r = run_mixtrain("version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "mixtrain 0.")) << r.output;
  const size_t at = r.output.find("LibTorch 2.");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_GE(std::stoi(r.output.substr(at + 11)), 11) << r.output;
  if (mixtrain::built_with_cuda()) {
    EXPECT_TRUE(contains(r.output, "\nBuild: CUDA ")) << r.output;
    EXPECT_TRUE(contains(r.output, "CUDA: compiled in")) << r.output;  // the CUDA wheel
  } else {
    EXPECT_TRUE(contains(r.output, "\nBuild: CPU-only (")) << r.output;
    EXPECT_TRUE(contains(r.output, "CUDA: not compiled in")) << r.output;
  }
  EXPECT_TRUE(contains(r.output, "CPU capability: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "\nCPU: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "\nCPU GEMM: bf16 ")) << r.output;
  EXPECT_TRUE(contains(r.output, "BLAS: mkl")) << r.output;
  // The override is what it prints, for both dtypes.
  const CommandResult widened = run_mixtrain("version", "MIXTRAIN_CPU_GEMM=widened");
  EXPECT_TRUE(contains(widened.output, "CPU GEMM: bf16 widened, fp16 widened (CPU class "))
      << widened.output;
  EXPECT_TRUE(contains(widened.output, "; MIXTRAIN_CPU_GEMM=widened)")) << widened.output;
}

// A bad MIXTRAIN_CPU_GEMM is one error, exit 2, before any worker starts or the run dir exists.
TEST(Cli, ABadCpuGemmVariableIsOneErrorBeforeAnyWorkStarts) {
  TempDir dir;
  const std::string run_dir = dir.path() + "/run";
  const CommandResult r =
      run_mixtrain("train --config " + source_path("configs/qwen2_moe_tiny.yaml") +
                       " --nproc 2 --run-dir " + run_dir,
                   "MIXTRAIN_CPU_GEMM=fast");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "mixtrain: error: MIXTRAIN_CPU_GEMM='fast' is not one of auto, "
                       "native, widened"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "launcher")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(run_dir));
}

TEST(Cli, UnknownCommandWithHelpIsAnErrorNotTheHelp) {
  const CommandResult r = run_mixtrain("nosuch --help");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "mixtrain: unknown command 'nosuch'")) << r.output;
  EXPECT_FALSE(contains(r.output, "Subcommands:")) << "printed the help:\n" << r.output;
}

TEST(Cli, UnknownNestedCommandsNameTheirParent) {
  const CommandResult show = run_mixtrain("config shwo x.yaml");
  EXPECT_EQ(show.exit_code, 2) << show.output;
  EXPECT_TRUE(contains(show.output,
                       "mixtrain: unknown command 'config shwo' (did you mean 'config show'?)"))
      << show.output;
  const CommandResult verify = run_mixtrain("ckpt verfy /tmp --help");
  EXPECT_EQ(verify.exit_code, 2) << verify.output;
  EXPECT_TRUE(contains(verify.output, "unknown command 'ckpt verfy' (did you mean 'ckpt verify'?)"))
      << verify.output;
}

TEST(Cli, RealCommandsAndHelpStillWork) {
  const CommandResult help = run_mixtrain("--help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_TRUE(contains(help.output, "optim-replay")) << help.output;
  const CommandResult train_help = run_mixtrain("train --help");
  EXPECT_EQ(train_help.exit_code, 0) << train_help.output;
  EXPECT_TRUE(contains(train_help.output, "--config")) << train_help.output;
  const CommandResult show =
      run_mixtrain("config show " + source_path("configs/qwen2_moe_tiny.toml"));
  EXPECT_EQ(show.exit_code, 0) << show.output;
  // No command at all is still CLI11's message, exit 2.
  const CommandResult none = run_mixtrain("");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_TRUE(contains(none.output, "A subcommand is required")) << none.output;
}

// The tiny TOML config with `from` replaced by `to`, written to <dir>/<name>.
std::string edited_toml(const TempDir& dir, const std::string& name, const std::string& from,
                        const std::string& to) {
  std::ifstream in(source_path("configs/qwen2_moe_tiny.toml"));
  std::stringstream text;
  text << in.rdbuf();
  std::string toml = text.str();
  const size_t at = toml.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) toml.replace(at, from.size(), to);
  const std::string path = dir.file(name);
  std::ofstream(path) << toml;
  return path;
}

// A data pattern matching no file is known only when the dataset is built; the error carries
// data.path and the CLI prints it as the TOML key, with the file (or --set) it came from. The
// readers keep no line numbers, so no line is printed.
TEST(Cli, BuildStepErrorsNameTheKeyAsTheUserWroteIt) {
  TempDir dir;
  const std::string pattern = dir.file("none_*.bin");
  const std::string config =
      edited_toml(dir, "tokens.toml", "dataset = \"synthetic\"",
                  "dataset = \"tokens\"\ndataset_path = \"" + pattern + "\"");
  const CommandResult file =
      run_mixtrain("train --config " + config + " --run-dir " + dir.file("run"));
  EXPECT_EQ(file.exit_code, 1) << file.output;  // a DataError
  EXPECT_TRUE(contains(file.output, "mixtrain: error: " + config +
                                        ": training.dataset_path: token files '" + pattern +
                                        "': the pattern matches no file"))
      << file.output;
  const size_t error_line = file.output.find("mixtrain: error: ");
  EXPECT_FALSE(contains(file.output.substr(std::min(error_line, file.output.size())), "data.path"))
      << file.output;

  const CommandResult set =
      run_mixtrain("train --config " + source_path("configs/qwen2_moe_tiny.toml") +
                   " --set training.dataset=tokens --set training.dataset_path=" + pattern +
                   " --run-dir " + dir.file("run2"));
  EXPECT_EQ(set.exit_code, 1) << set.output;
  EXPECT_TRUE(contains(
      set.output, "mixtrain: error: --set: training.dataset_path: token files '" + pattern + "'"))
      << set.output;

  // The YAML dialect's key is the canonical one.
  const CommandResult yaml = run_mixtrain(
      "train --config " + source_path("configs/qwen2_moe_tiny.yaml") +
      " --set data.kind=tokens --set data.path=" + pattern + " --run-dir " + dir.file("run3"));
  EXPECT_EQ(yaml.exit_code, 1) << yaml.output;
  EXPECT_TRUE(contains(yaml.output, "mixtrain: error: --set: data.path: token files '" + pattern +
                                        "': the pattern matches no file"))
      << yaml.output;
}

// --nproc against the config's degrees, checked by the CLI before launching: the degrees are
// named in the config's dialect.
TEST(Cli, NprocMismatchNamesTheDegreesAsWritten) {
  const CommandResult r =
      run_mixtrain("train --config " + source_path("configs/qwen2_moe_tiny.toml") +
                   " --nproc 4 --set parallelism.data_parallel_shard_degree=2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output,
                       ": parallel: --nproc 4 but parallelism.data_parallel_replicate_degree x "
                       "parallelism.data_parallel_shard_degree x "
                       "parallelism.context_parallel_degree x "
                       "parallelism.tensor_parallel_degree = 2"))
      << r.output;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
