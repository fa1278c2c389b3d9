#include "mixtrain/cli/eval_command.h"

#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "mixtrain/cli/worker_launch.h"
#include "mixtrain/config/load.h"
#include "mixtrain/config/show.h"
#include "mixtrain/core/device.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/distributed/config_agreement.h"
#include "mixtrain/distributed/rendezvous.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/trainer/checkpointing.h"
#include "mixtrain/trainer/evaluator.h"
#include "mixtrain/trainer/threads.h"
#include "mixtrain/trainer/trainer.h"

namespace mixtrain {
namespace {

constexpr int kUsage = 2;  // the exit code of an argument the user has to fix

// The config's overrides, with --init-from as model.init_from (a JSON string is a YAML value,
// so any path survives the override parser).
std::vector<std::string> overrides_of(const EvalCommandOptions& options) {
  std::vector<std::string> overrides = options.overrides;
  if (!options.init_from.empty()) {
    overrides.push_back("model.init_from=" + nlohmann::json(options.init_from).dump());
  }
  return overrides;
}

// A data or checkpoint error of this command is one of its arguments: exit 2.
[[noreturn]] void rethrow_as_usage(const UserError& error, const std::string& argument) {
  throw UserError(argument + ": " + error.what(), kUsage);
}

EvalResult evaluate_on_this_rank(const ResolvedConfig& resolved, const EvalCommandOptions& options,
                                 std::optional<int64_t>& step) {
  const TrainerConfig& config = resolved.config;
  const c10::Device device = resolve_train_device(config);
  set_current_device(device);
  DeviceMesh mesh = join_mesh(config, device);
  if (mesh.world_size > 1) check_config_agreement(mesh, format_config_show(resolved));
  configure_threads();

  // The eval set first: a bad --data fails before a model is built.
  const int64_t batches = options.max_batches >= 0 ? options.max_batches : config.data.eval_batches;
  std::optional<Evaluator> evaluator;
  try {
    evaluator.emplace(options.data, config.model.vocab_size, config.data.seq_len,
                      config.data.micro_batch_size, batches * config.data.global_batch_size);
  } catch (const DataError& error) {
    rethrow_as_usage(error, "--data");
  }
  if (mesh.rank == 0) log_info(evaluator->describe());

  BuiltModel built = build_training_model(config, mesh);
  if (!options.checkpoint.empty()) {
    try {
      step = restore_model_weights(*built.model, built.sharded.get(), resolved, mesh,
                                   options.checkpoint);
    } catch (const DataError& error) {
      rethrow_as_usage(error, "--checkpoint");
    }
  }
  return evaluator->evaluate(*built.model, mesh);
}

}  // namespace

int eval_command(const EvalCommandOptions& options, int argc, char** argv) {
  if (options.checkpoint.empty() == options.init_from.empty()) {
    throw UserError(
        "eval: give exactly one of --checkpoint DIR (a mixtrain checkpoint) and "
        "--init-from DIR (a Hugging Face model directory)",
        kUsage);
  }
  const std::vector<std::string> overrides = overrides_of(options);
  if (should_launch(options.nproc)) {
    return launch_data_parallel_workers(options.config_path, overrides, options.nproc, argc, argv);
  }
  const ResolvedConfig resolved = load_config(options.config_path, overrides);
  std::optional<int64_t> step;
  EvalResult result;
  in_user_dialect(resolved, [&] {
    result = evaluate_on_this_rank(resolved, options, step);
    return 0;
  });
  if (detect_rank_info().rank != 0) return 0;
  if (options.json) {
    nlohmann::ordered_json out;
    out["eval_loss"] = result.loss();
    out["eval_ppl"] = result.perplexity();
    out["eval_tokens"] = result.tokens;
    out["eval_windows"] = result.windows;
    out["step"] = step ? nlohmann::ordered_json(*step) : nlohmann::ordered_json(nullptr);
    std::cout << out.dump() << std::endl;
  } else {
    std::cout << format_eval_result(result) << std::endl;
  }
  return 0;
}

}  // namespace mixtrain
