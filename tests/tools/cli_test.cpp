// The command line itself (cli/cli.cpp): a word that names no command is an error with the
// nearest command, exit 2, at every level and also with --help; real commands still parse.
#include <gtest/gtest.h>

#include <string>

#include "tools/cli_test_util.h"

namespace mixtrain::testing {
namespace {

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(Cli, TypoedCommandNamesTheNearestCommand) {
  const CommandResult r = run_mixtrain("trian --config x.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "mixtrain: unknown command 'trian' (did you mean 'train'?)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "commands: train, optim-replay, config, ckpt, version"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "A subcommand is required")) << r.output;
}

// `mixtrain version` names LibTorch >= 2.11 (the wheel scripts/setup.sh installs), whether CUDA
// is compiled in, the CPU capability and the BLAS; no run starts.
TEST(Cli, VersionNamesLibTorchCudaCapabilityAndBlas) {
  const CommandResult r = run_mixtrain("version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "mixtrain 0.")) << r.output;
  const size_t at = r.output.find("LibTorch 2.");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_GE(std::stoi(r.output.substr(at + 11)), 11) << r.output;
  EXPECT_TRUE(contains(r.output, "CUDA: compiled in")) << r.output;  // the CUDA wheel
  EXPECT_TRUE(contains(r.output, "CPU capability: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "BLAS: mkl")) << r.output;
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

}  // namespace
}  // namespace mixtrain::testing
