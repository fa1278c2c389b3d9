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
#include "mixtrain/cli/eval_command.h"
#include "mixtrain/cli/export_hf_command.h"
#include "mixtrain/cli/worker_launch.h"
#include "mixtrain/config/document.h"
#include "mixtrain/config/load.h"
#include "mixtrain/config/show.h"
#include "mixtrain/core/build_info.h"
#include "mixtrain/core/cpu_gemm.h"
#include "mixtrain/core/device.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/core/printable.h"
#include "mixtrain/distributed/launcher.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/optimizer_table.h"
#include "mixtrain/trainer/optim_replay.h"
#include "mixtrain/trainer/trainer.h"

namespace mixtrain {
namespace {

constexpr int kExitInterrupted = 130;

std::string default_run_dir(const std::string& config_path) {
  return (std::filesystem::path("runs") / std::filesystem::path(config_path).stem()).string();
}

int train_command(const std::string& config_path, const std::vector<std::string>& overrides,
                  std::string run_dir, int nproc, int argc, char** argv) {
  if (should_launch(nproc)) {
    return launch_data_parallel_workers(config_path, overrides, nproc, argc, argv);
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
  // The components' config sections, before any config is read (config/section.h).
  register_model_sections();
  register_optimizer_sections();
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

  EvalCommandOptions eval_options;
  CLI::App* eval =
      app.add_subcommand("eval", "mean loss and perplexity over held-out token shards");
  eval->add_option("--config", eval_options.config_path, "config file (.yaml/.yml or .toml)")
      ->required();
  eval->add_option("--set", eval_options.overrides, "override a key: --set a.b.c=value");
  eval->add_option("--checkpoint", eval_options.checkpoint,
                   "mixtrain checkpoint (step dir or dir)");
  eval->add_option("--init-from", eval_options.init_from, "Hugging Face model directory");
  eval->add_option("--data", eval_options.data, "token shards: file, glob, or dir (its val_*.bin)")
      ->required();
  eval->add_option("--nproc", eval_options.nproc, "local worker processes (data-parallel ranks)")
      ->check(CLI::Range(1, 4096));
  eval->add_option(
          "--max-batches", eval_options.max_batches,
          "evaluate N x data.global_batch_size windows (0: all; default data.eval_batches)")
      ->check(CLI::NonNegativeNumber);
  eval->add_flag("--json", eval_options.json, "print one JSON object instead of the line");

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
  std::string export_dtype = "f32", export_shard_size = "5GB";
  CLI::App* export_hf = app.add_subcommand(
      "export-hf",
      "write a checkpoint as a Hugging Face model directory (config.json, safetensors)");
  export_hf->add_option("checkpoint", ckpt_a, ckpt_help)->required();
  export_hf->add_option("out", ckpt_b, "new (or empty) output directory")->required();
  export_hf->add_option("--dtype", export_dtype, "bf16 or f32 (default f32)");
  export_hf->add_option("--max-shard-size", export_shard_size,
                        "largest safetensors file: bytes, or 5GB, 500MB, 2GiB (default 5GB)");

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
    // The environment's GEMM choice (MIXTRAIN_CPU_GEMM) is checked here, once, before any command
    // starts workers or writes anything: a bad value is one error and exit 2, not one per rank.
    cpu_gemm_choice();
    if (version->parsed()) {
      std::cout << format_build_info(build_info());
      return 0;
    }
    if (train->parsed()) return train_command(config_path, overrides, run_dir, nproc, argc, argv);
    if (show->parsed()) return config_show_command(config_path, overrides);
    if (eval->parsed()) return eval_command(eval_options, argc, argv);
    if (replay->parsed())
      return optim_replay_command(config_path, overrides, replay_paths, nproc, argc, argv);
    if (prepare->parsed()) return data_prepare_command(prepare_options);
    if (inspect->parsed()) return ckpt_inspect_command(ckpt_a);
    if (export_hf->parsed()) {
      return export_hf_command(ckpt_a, ckpt_b, export_dtype, export_shard_size);
    }
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
