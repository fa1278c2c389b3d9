#include "mixtrain/cli/cli.h"

#include <c10/util/Exception.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "mixtrain/config/load.h"
#include "mixtrain/config/show.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/trainer/optim_replay.h"
#include "mixtrain/trainer/trainer.h"

namespace mixtrain {
namespace {

constexpr int kExitInterrupted = 130;

std::string default_run_dir(const std::string& config_path) {
  return (std::filesystem::path("runs") / std::filesystem::path(config_path).stem()).string();
}

int train_command(const std::string& config_path, const std::vector<std::string>& overrides,
                  std::string run_dir) {
  ResolvedConfig resolved = load_config(config_path, overrides);
  TrainOptions options;
  options.run_dir = run_dir.empty() ? default_run_dir(config_path) : run_dir;
  options.is_terminal = isatty(fileno(stderr)) != 0;
  TrainSummary summary = run_training(resolved, options);
  log_info("metrics: " + summary.metrics_path);
  log_info("loss curve: " + summary.plot_path);
  if (summary.interrupted) {
    log_warn("interrupted after step " + std::to_string(summary.steps_completed) +
             "; metrics are complete up to that step");
    return kExitInterrupted;
  }
  return 0;
}

int config_show_command(const std::string& config_path, const std::vector<std::string>& overrides) {
  ResolvedConfig resolved = load_config(config_path, overrides);
  std::cout << format_config_show(resolved);
  return 0;
}

int optim_replay_command(const std::string& config_path, const std::vector<std::string>& overrides,
                         const ReplayPaths& paths) {
  ResolvedConfig resolved = load_config(config_path, overrides);
  run_optim_replay(resolved, paths);
  return 0;
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"mixtrain: LLM training with FP32 main params, Muon + AdamW"};
  app.require_subcommand(1);

  std::string config_path;
  std::vector<std::string> overrides;
  std::string run_dir;

  CLI::App* train = app.add_subcommand("train", "train a model from a YAML or TOML config");
  train->add_option("--config", config_path, "config file (.yaml/.yml or .toml)")->required();
  train->add_option("--set", overrides, "override a key: --set a.b.c=value (repeatable)");
  train->add_option("--run-dir", run_dir,
                    "where metrics.jsonl and loss.svg go (default runs/<config name>)");

  ReplayPaths replay_paths;
  CLI::App* replay = app.add_subcommand(
      "optim-replay", "run the configured optimizer on given params and fp32 grads (safetensors)");
  replay->add_option("--config", config_path, "config file (.yaml/.yml or .toml)")->required();
  replay->add_option("--set", overrides, "override a key: --set a.b.c=value (repeatable)");
  replay->add_option("--params", replay_paths.params, "parameters by name, in model dtype")
      ->required();
  replay->add_option("--grads", replay_paths.grads, "float32 grads keyed step.<k>.<name>")
      ->required();
  replay->add_option("--out", replay_paths.out, "output: model.*, main params, optimizer state")
      ->required();

  CLI::App* config = app.add_subcommand("config", "inspect configurations");
  config->require_subcommand(1);
  CLI::App* show = config->add_subcommand("show", "print every resolved key with its source");
  show->add_option("file", config_path, "config file (.yaml/.yml or .toml)")->required();
  show->add_option("--set", overrides, "override a key: --set a.b.c=value (repeatable)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "mixtrain: " << e.what() << " (see mixtrain --help)" << std::endl;
    return 2;
  }

  try {
    if (train->parsed()) return train_command(config_path, overrides, run_dir);
    if (show->parsed()) return config_show_command(config_path, overrides);
    if (replay->parsed()) return optim_replay_command(config_path, overrides, replay_paths);
  } catch (const UserError& e) {
    std::cerr << "mixtrain: error: " << e.what() << std::endl;
    return e.exit_code();
  } catch (const c10::Error& e) {
    std::cerr << "mixtrain: internal error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "mixtrain: internal error: " << e.what() << std::endl;
    return 1;
  }
  return 2;
}

}  // namespace mixtrain
