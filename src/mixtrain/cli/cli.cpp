#include "mixtrain/cli/cli.h"

#include <c10/util/Exception.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixtrain/cli/ckpt_command.h"
#include "mixtrain/cli/data_command.h"
#include "mixtrain/config/document.h"
#include "mixtrain/config/load.h"
#include "mixtrain/config/show.h"
#include "mixtrain/core/build_info.h"
#include "mixtrain/core/device.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/core/printable.h"
#include "mixtrain/distributed/launcher.h"
#include "mixtrain/trainer/optim_replay.h"
#include "mixtrain/trainer/trainer.h"

namespace mixtrain {
namespace {

constexpr int kExitInterrupted = 130;

// argv without "--nproc N" / "--nproc=N": what each local worker runs.
std::vector<std::string> worker_argv(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--nproc") {
      ++i;
      continue;
    }
    if (arg.rfind("--nproc=", 0) == 0) continue;
    out.push_back(arg);
  }
  return out;
}

// `--nproc N` (N > 1) in the launching process: validate the config once, here, then start N
// local workers running the same command; the workers (MIXTRAIN_LAUNCHED=1) do the work.
bool should_launch(int nproc) {
  return nproc > 1 && std::getenv("MIXTRAIN_LAUNCHED") == nullptr;
}

// Runs `body` on a loaded config. A UserError carrying a canonical key (thrown by a build step,
// core/error.h) is rethrown with the key as the user wrote it and where: "<file or --set>:
// <key>: <problem>" (config/provenance.h format_user_error); the exit code stays.
template <typename Body>
int in_user_dialect(const ResolvedConfig& resolved, Body&& body) {
  try {
    return body();
  } catch (const UserError& error) {
    if (error.key().empty()) throw;
    throw UserError(format_user_error(error, resolved.provenance), error.exit_code());
  }
}

std::string default_run_dir(const std::string& config_path) {
  return (std::filesystem::path("runs") / std::filesystem::path(config_path).stem()).string();
}

int train_command(const std::string& config_path, const std::vector<std::string>& overrides,
                  std::string run_dir, int nproc, int argc, char** argv) {
  if (should_launch(nproc)) {
    // A config without data-parallel degrees runs as N-way FSDP (torchtitan's shard degree -1).
    // Its validation must see that degree (e.g. parallel.ep must divide dp_shard), so when the
    // config as written fails or has dp_replicate x dp_shard = 1, it is resolved again with
    // dp_shard = N; that resolution's error, if any, is the one reported.
    std::vector<std::string> argv_for_workers = worker_argv(argc, argv);
    std::optional<ResolvedConfig> as_written;
    try {
      as_written = load_config(config_path, overrides);
    } catch (const ConfigError&) {
    }
    ResolvedConfig resolved;
    if (as_written &&
        as_written->config.parallel.dp_replicate * as_written->config.parallel.dp_shard != 1) {
      resolved = *as_written;
    } else {
      const bool toml = std::filesystem::path(config_path).extension() == ".toml";
      const std::string set =
          std::string(toml ? "parallelism.data_parallel_shard_degree" : "parallel.dp_shard") + "=" +
          std::to_string(nproc);
      std::vector<std::string> with_shard = overrides;
      with_shard.push_back(set);
      resolved = load_config(config_path, with_shard);
      argv_for_workers.push_back("--set");
      argv_for_workers.push_back(set);
    }
    const int64_t world = resolved.config.parallel.dp_replicate * resolved.config.parallel.dp_shard;
    if (world != nproc) {
      const Provenance& spelled = resolved.provenance;
      throw ConfigError(resolved.config.source_file + ": parallel: --nproc " +
                        std::to_string(nproc) + " but " +
                        spelled.user_key("parallel.dp_replicate") + " x " +
                        spelled.user_key("parallel.dp_shard") + " = " + std::to_string(world));
    }
    // Devices the workers cannot have are refused once, here; each worker still probes its own.
    if (resolved.config.train.device == "cuda") {
      in_user_dialect(resolved, [&] {
        try {
          check_cuda_devices(0, nproc);
        } catch (const std::invalid_argument& error) {
          throw ConfigError(ConfigKey{"train.device"}, error.what());
        }
        return 0;
      });
    }
    return launch_local_workers(nproc, argv_for_workers, resolved.config.distributed.timeout_s);
  }
  ResolvedConfig resolved = load_config(config_path, overrides);
  TrainOptions options;
  options.run_dir = run_dir.empty() ? default_run_dir(config_path) : run_dir;
  options.is_terminal = isatty(fileno(stderr)) != 0;
  TrainSummary summary;
  in_user_dialect(resolved, [&] {
    summary = run_training(resolved, options);
    return 0;
  });
  if (!summary.metrics_path.empty()) {  // rank 0
    log_info("metrics: " + summary.metrics_path);
    log_info("loss curve: " + summary.plot_path);
  }
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
                         const ReplayPaths& paths, int nproc, int argc, char** argv) {
  ResolvedConfig resolved = load_config(config_path, overrides);
  if (should_launch(nproc)) {  // FSDP layout over nproc ranks, whatever parallel.* says
    return launch_local_workers(nproc, worker_argv(argc, argv),
                                resolved.config.distributed.timeout_s);
  }
  return in_user_dialect(resolved, [&] {
    run_optim_replay(resolved, paths);
    return 0;
  });
}

// The first words that name no command where one is expected: "unknown command 'trian' (did
// you mean 'train'?)" with the nearest name, as for config keys, instead of CLI11's "A
// subcommand is required" (or its help for `mixtrain trian --help`). Options are CLI11's.
std::optional<std::string> unknown_command(const CLI::App& app, int argc, char** argv) {
  const CLI::App* level = &app;
  std::string path;  // the commands before this word, "config " for `mixtrain config shwo`
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const auto commands = level->get_subcommands([](const CLI::App*) { return true; });
    if (commands.empty() || word.empty() || word[0] == '-') return std::nullopt;
    std::vector<std::string> names;
    const CLI::App* next = nullptr;
    for (const CLI::App* command : commands) {
      names.push_back(command->get_name());
      if (command->get_name() == word) next = command;
    }
    if (next == nullptr) {
      std::string list;
      for (const std::string& name : names) list += (list.empty() ? "" : ", ") + path + name;
      return "unknown command '" + path + word + "' (did you mean '" + path +
             closest_key(word, names) + "'?); commands: " + list;
    }
    level = next;
    path += word + " ";
  }
  return std::nullopt;
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"mixtrain: LLM training with FP32 main params (AdamW, Muon + AdamW or SGD)"};
  app.require_subcommand(1);

  std::string config_path;
  std::vector<std::string> overrides;
  std::string run_dir;

  CLI::App* train = app.add_subcommand("train", "train a model from a YAML or TOML config");
  train->add_option("--config", config_path, "config file (.yaml/.yml or .toml)")->required();
  train->add_option("--set", overrides, "override a key: --set a.b.c=value (repeatable)");
  int nproc = 1;
  train->add_option("--nproc", nproc, "local worker processes (data-parallel ranks)")
      ->check(CLI::Range(1, 4096));
  train->add_option("--run-dir", run_dir,
                    "where metrics.jsonl and loss.svg go (default runs/<config name>)");

  ReplayPaths replay_paths;
  CLI::App* replay = app.add_subcommand(
      "optim-replay", "run the configured optimizer on given params and fp32 grads (safetensors)");
  replay->add_option("--config", config_path, "config file (.yaml/.yml or .toml)")->required();
  replay->add_option("--nproc", nproc, "local worker processes: FSDP over N ranks")
      ->check(CLI::Range(1, 4096));
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

  CLI::App* ckpt = app.add_subcommand("ckpt", "look into checkpoints");
  ckpt->require_subcommand(1);
  std::string ckpt_a, ckpt_b;
  const char* ckpt_help = "step directory, or checkpoint directory with `latest`";
  CLI::App* inspect = ckpt->add_subcommand("inspect", "list step, layout, tensors and state");
  inspect->add_option("dir", ckpt_a, ckpt_help)->required();
  CLI::App* verify = ckpt->add_subcommand("verify", "check every file and checksum");
  verify->add_option("dir", ckpt_a, ckpt_help)->required();
  CLI::App* diff = ckpt->add_subcommand("diff", "compare two checkpoints tensor by tensor");
  diff->add_option("a", ckpt_a, ckpt_help)->required();
  diff->add_option("b", ckpt_b, ckpt_help)->required();
  double atol = 0;
  CLI::Option* atol_option =
      diff->add_option("--atol", atol, "pass when every max abs difference is <= X")
          ->check(CLI::NonNegativeNumber);

  DataPrepareOptions prepare_options;
  CLI::App* prepare = add_data_command(app, prepare_options);

  CLI::App* version = app.add_subcommand(
      "version", "mixtrain's version and commit, LibTorch, CUDA, CPU capability, BLAS");

  if (const std::optional<std::string> error = unknown_command(app, argc, argv)) {
    std::cerr << "mixtrain: " << *error << std::endl;
    return 2;
  }
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
    if (version->parsed()) {
      std::cout << format_build_info(build_info());
      return 0;
    }
    if (train->parsed()) return train_command(config_path, overrides, run_dir, nproc, argc, argv);
    if (show->parsed()) return config_show_command(config_path, overrides);
    if (replay->parsed())
      return optim_replay_command(config_path, overrides, replay_paths, nproc, argc, argv);
    if (prepare->parsed()) return data_prepare_command(prepare_options);
    if (inspect->parsed()) return ckpt_inspect_command(ckpt_a);
    if (verify->parsed()) return ckpt_verify_command(ckpt_a);
    if (diff->parsed()) {
      return ckpt_diff_command(
          ckpt_a, ckpt_b, atol_option->count() > 0 ? std::optional<double>(atol) : std::nullopt);
    }
  } catch (const UserError& e) {
    // Messages may quote file contents: printable() so that no raw byte reaches the terminal.
    std::cerr << "mixtrain: error: " << printable(e.what(), true) << std::endl;
    return e.exit_code();
  } catch (const c10::Error& e) {
    std::cerr << "mixtrain: internal error: " << printable(e.what_without_backtrace(), true)
              << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "mixtrain: internal error: " << printable(e.what(), true) << std::endl;
    return 1;
  }
  return 2;
}

}  // namespace mixtrain
