#include "mixtrain/trainer/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <utility>
#include <vector>

#include "mixtrain/config/startup_log.h"
#include "mixtrain/core/blas_check.h"
#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/data/dataset.h"
#include "mixtrain/model/init_dtype.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/grad_clip.h"
#include "mixtrain/optim/lr_schedule.h"
#include "mixtrain/optim/param_groups.h"
#include "mixtrain/optim/training_optimizer.h"
#include "mixtrain/trainer/interrupt.h"
#include "mixtrain/trainer/loss_plot.h"
#include "mixtrain/trainer/metrics_writer.h"
#include "mixtrain/trainer/progress.h"

namespace mixtrain {
namespace {

using Clock = std::chrono::steady_clock;

// Single-process training computes in the model's own dtype. What needs the distributed
// machinery (sharding, a compute dtype other than the stored one) or checkpoints is refused
// up front with the key that asks for it, never approximated.
void refuse_unsupported(const TrainerConfig& config, c10::ScalarType model_dtype) {
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw ConfigError(config.source_file + ": " + key + ": " + why);
  };
  const std::string single = " (this build trains in one process)";
  if (model_dtype == c10::kHalf)
    refuse("model_init_dtype",
           "float16 models need compute in fsdp_config.mix_precision.param_dtype float32 or "
           "bfloat16 (LibTorch 1.13 has no float16 GEMM on CPU), which needs the FSDP "
           "parameter path; not available yet" +
               single);
  if (parse_float_dtype(config.mix_precision.param_dtype) != model_dtype)
    refuse("fsdp_config.mix_precision.param_dtype",
           config.mix_precision.param_dtype + " differs from the model dtype " +
               dtype_name(model_dtype) +
               "; computing in another dtype than the stored one needs the FSDP parameter "
               "path, not available yet" +
               single);
  if (config.parallel.dp_shard != 1 || config.parallel.dp_replicate != 1 || config.parallel.ep != 1)
    refuse("parallel", "distributed training is not available yet" + single);
  if (!config.checkpoint.dir.empty() || !config.checkpoint.restore_from.empty())
    refuse("checkpoint", "checkpointing is not available yet" + single);
  if (config.optimizer.swap_optimizer)
    refuse("optimizer.swap_optimizer", "the swap optimizer is not available yet" + single);
}

c10::ScalarType model_dtype_of(const TrainerConfig& config) {
  if (!config.model_init_dtype) return c10::kFloat;  // models are built in float32
  return *parse_float_dtype(*config.model_init_dtype);
}

NamedParameters named_parameters_of(const CausalLM& model) {
  NamedParameters params;
  for (const auto& item : model.named_parameters()) params.emplace_back(item.key(), item.value());
  return params;
}

void configure_threads() {
  // Respect an explicit OMP_NUM_THREADS (ctest sets 1); otherwise use every core.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  }
}

struct StepLoss {
  double loss = 0.0;  // cross-entropy + coef * aux, mean over micro-batches
  double aux_loss = 0.0;
};

// Forward/backward over the micro-batches of one optimizer step; gradients accumulate in .grad.
StepLoss accumulate_gradients(CausalLM& model, TokenDataset& data, const TrainerConfig& config,
                              int64_t accumulation_steps, TrainingOptimizer& optimizer) {
  StepLoss total;
  for (int64_t micro = 0; micro < accumulation_steps; ++micro) {
    Batch batch = data.next_batch(config.data.micro_batch_size, config.data.seq_len);
    CausalLMOutput out = model.forward(batch.input_ids);
    const int64_t vocab = out.logits.size(-1);
    torch::Tensor cross_entropy = torch::nn::functional::cross_entropy(
        out.logits.reshape({-1, vocab}).to(torch::kFloat), batch.labels.reshape({-1}));
    torch::Tensor loss = cross_entropy + config.model.router_aux_loss_coef * out.aux_loss;
    (loss * (optimizer.loss_scale() / static_cast<double>(accumulation_steps))).backward();
    optimizer.accumulate_model_grads();  // fp32 main_grad accumulation across micro-batches
    total.loss += loss.item<double>() / accumulation_steps;
    total.aux_loss += out.aux_loss.item<double>() / accumulation_steps;
  }
  return total;
}

}  // namespace

TrainSummary run_training(const ResolvedConfig& resolved, const TrainOptions& options) {
  const TrainerConfig& config = resolved.config;
  refuse_unsupported(config, model_dtype_of(config));
  configure_threads();
  warn_if_reference_blas();
  log_info(format_trainer_config_block(resolved));

  // RFC 6.1 build order: model, then model_init_dtype, then the optimizer.
  std::shared_ptr<CausalLM> model = build_model(config.model, config.train.seed);
  std::optional<c10::ScalarType> init_dtype;
  if (config.model_init_dtype) init_dtype = parse_float_dtype(*config.model_init_dtype);
  apply_model_init_dtype(*model, init_dtype);
  log_info(format_model_config_block(config.model));
  std::unique_ptr<TrainingOptimizer> optimizer =
      build_optimizer(named_parameters_of(*model), config);
  log_info(format_effective_adamw_block(resolved));
  log_info(format_effective_muon_block(resolved));

  std::unique_ptr<TokenDataset> data =
      make_dataset(config.data, config.model.vocab_size, config.train.seed, 0, 1);
  log_info("data: " + data->describe());
  const int64_t accumulation_steps = config.data.global_batch_size / config.data.micro_batch_size;
  const double tokens_per_step =
      static_cast<double>(config.data.global_batch_size) * config.data.seq_len;
  LrSchedule schedule(config.train.lr_scheduler, config.train.steps);

  TrainSummary summary;
  MetricsWriter metrics(options.run_dir);
  summary.metrics_path = metrics.path();
  summary.plot_path = (std::filesystem::path(options.run_dir) / "loss.svg").string();
  ProgressBar progress(config.train.steps, config.train.log_every, options.is_terminal);
  std::vector<std::pair<int64_t, double>> loss_curve;

  install_interrupt_handler();
  const auto start = Clock::now();
  for (int64_t step = 1; step <= config.train.steps; ++step) {
    if (interrupt_requested()) {
      summary.interrupted = true;
      break;
    }
    const auto step_start = Clock::now();
    const double lr_factor = schedule.factor(step);
    optimizer->set_lr_factor(lr_factor);

    StepLoss loss = accumulate_gradients(*model, *data, config, accumulation_steps, *optimizer);
    optimizer->prepare_grads();
    const double grad_norm =
        clip_grad_norm(optimizer->grads_for_clipping(), config.train.max_grad_norm);
    optimizer->step_with_ready_grads();
    optimizer->zero_grad();

    const auto now = Clock::now();
    StepMetrics row;
    row.step = step;
    row.loss = loss.loss;
    row.aux_loss = loss.aux_loss;
    row.grad_norm = grad_norm;
    row.lr = config.optimizer.adamw.lr * lr_factor;
    row.tokens_per_s = tokens_per_step / std::chrono::duration<double>(now - step_start).count();
    row.elapsed_s = std::chrono::duration<double>(now - start).count();
    metrics.write(row);
    progress.update(step, row.loss, row.tokens_per_s, row.elapsed_s);
    loss_curve.emplace_back(step, row.loss);
    if (step == 1) summary.first_loss = row.loss;
    summary.last_loss = row.loss;
    summary.steps_completed = step;
  }
  progress.finish();
  write_loss_svg(summary.plot_path, loss_curve, "mixtrain loss: " + config.source_file);
  return summary;
}

}  // namespace mixtrain
