#include "mixtrain/trainer/trainer.h"

#include <ATen/DeviceAccelerator.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "mixtrain/checkpoint/hf_import.h"
#include "mixtrain/config/schema.h"
#include "mixtrain/config/show.h"
#include "mixtrain/config/startup_log.h"
#include "mixtrain/config/validate.h"
#include "mixtrain/core/build_info.h"
#include "mixtrain/core/caching_cpu_allocator.h"
#include "mixtrain/core/collectives.h"
#include "mixtrain/core/device.h"
#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/host_sync.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/core/op_counter.h"
#include "mixtrain/core/param_placement.h"
#include "mixtrain/core/text.h"
#include "mixtrain/data/dataset.h"
#include "mixtrain/distributed/config_agreement.h"
#include "mixtrain/distributed/context_parallel.h"
#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/distributed/fsdp.h"
#include "mixtrain/distributed/parallelize.h"
#include "mixtrain/distributed/rendezvous.h"
#include "mixtrain/model/init_dtype.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/lr_schedule.h"
#include "mixtrain/optim/muon_config.h"
#include "mixtrain/optim/optimizer_table.h"
#include "mixtrain/optim/param_groups.h"
#include "mixtrain/optim/state_swap.h"
#include "mixtrain/optim/training_optimizer.h"
#include "mixtrain/trainer/checkpointing.h"
#include "mixtrain/trainer/evaluator.h"
#include "mixtrain/trainer/interrupt.h"
#include "mixtrain/trainer/loss_plot.h"
#include "mixtrain/trainer/metrics_writer.h"
#include "mixtrain/trainer/model_state_hook.h"
#include "mixtrain/trainer/muon_telemetry_hook.h"
#include "mixtrain/trainer/optimizer_report.h"
#include "mixtrain/trainer/progress.h"
#include "mixtrain/trainer/qk_clip_hook.h"
#include "mixtrain/trainer/run_hook.h"
#include "mixtrain/trainer/step_hook.h"
#include "mixtrain/trainer/step_log.h"
#include "mixtrain/trainer/step_profile.h"
#include "mixtrain/trainer/step_recorder.h"
#include "mixtrain/trainer/threads.h"

namespace mixtrain {
namespace {

// Seconds spent reducing gradients (FSDP reduce-scatter, DDP/HSDP and expert all-reduce)
// between two snapshots of a rank's communication counters.
double gradient_reduce_seconds(const CollectiveStats& span) {
  return span[CollectiveOp::kReduceScatter].seconds + span[CollectiveOp::kAllReduce].seconds;
}

// What this build cannot train (a valid config, as `config show` shows it) is refused up front
// on the key that asks for it, never approximated.
void refuse_unsupported(const TrainerConfig& config, c10::ScalarType model_dtype) {
  if (model_dtype == c10::kHalf && !config.optimizer.fp32_main_params) {
    throw ConfigError(ConfigKey{"optimizer.fp32_main_params"},
                      "float16 models need fp32 main params and loss scaling; set it to true");
  }
}

// optimizer.swap_optimizer for state on `device` (the parameters'): CPU state lives in this
// rank's file under optimizer.swap_dir (default <run_dir>/swap); a directory or file that cannot
// be made is an error on optimizer.swap_dir. Device state lives in pinned host memory (no file).
std::unique_ptr<StateSwap> make_state_swap(const OptimizerConfig& config,
                                           const std::string& run_dir, int rank,
                                           c10::Device device) {
  if (!device.is_cpu()) {
    return std::make_unique<StateSwap>("", config.swap_bucket_mb << 20, config.swap_merge_buckets,
                                       device);
  }
  const ConfigKey key{"optimizer.swap_dir"};
  const std::filesystem::path dir = config.swap_dir.empty()
                                        ? std::filesystem::path(run_dir) / "swap"
                                        : std::filesystem::path(config.swap_dir);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    throw UserError(key, "swap optimizer: cannot create the directory " + dir.string() + ": " +
                             error.message());
  }
  const std::string path =
      (dir / ("optimizer_state.rank" + std::to_string(rank) + ".swap")).string();
  try {
    return std::make_unique<StateSwap>(path, config.swap_bucket_mb << 20,
                                       config.swap_merge_buckets);
  } catch (const UserError& failure) {
    if (!failure.key().empty()) throw;
    throw UserError(key, failure.what(), failure.exit_code());
  }
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

// model.init_from: this rank's pieces of every parameter from the Hugging Face directory, after
// sharding (each rank reads only its rows) and after the optimizer is built: a low-precision
// parameter with an fp32 main param is read into the main param (the file's values, exact when
// the file is float32) and the model param is its rounding (to nearest even, as the copy-back
// after each step); any other parameter is read into itself.
// Without an optimizer (eval) every parameter is read into itself.
void import_init_from(CausalLM& model, const FullyShardedModel* sharded,
                      const TrainingOptimizer* optimizer, const std::string& dir, bool is_rank0) {
  std::map<std::string, at::Tensor> mains;
  if (optimizer != nullptr) {
    for (const auto& [key, tensor] : optimizer->state_dict()) {
      if (starts_with(key, kMainParamPrefix)) {
        mains[key.substr(std::string(kMainParamPrefix).size())] = tensor;
      }
    }
  }
  std::vector<HfImportTarget> targets;
  std::vector<std::pair<at::Tensor, at::Tensor>> rounded;  // (model param, its main param)
  for (const auto& item : model.named_parameters()) {
    const at::Tensor& param = item.value();
    const auto main = mains.find(item.key());
    const at::Tensor& local = main == mains.end() ? param : main->second;
    if (main != mains.end()) rounded.emplace_back(param, main->second);
    targets.push_back({item.key(), local,
                       sharded ? sharded->placement(item.key())
                               : whole_placement(item.key(), param.sizes().vec())});
  }
  // The model's own state (deepseek_v3's selection biases, HF buffers saved with the weights):
  // whole on every rank, filled in place.
  for (const auto& [name, tensor] : model.model_state()) {
    targets.push_back({name, tensor, whole_placement(name, tensor.sizes().vec())});
  }
  const HfImportStats stats = import_hf_weights(dir, targets);
  {
    torch::NoGradGuard no_grad;
    for (auto& [param, main] : rounded) param.copy_(main);
  }
  if (is_rank0) {
    log_info("init_from: " + std::to_string(targets.size()) + " parameters from " + dir + " (" +
             std::to_string(stats.files) + " safetensors file(s); this rank read " +
             std::to_string(stats.data_bytes_read) + " bytes of weights" +
             (rounded.empty() ? "" : ", into the fp32 main params") + ")");
  }
}

// Forward/backward over the micro-batches of one optimizer step; gradients accumulate in .grad.
// Records the forward, backward and gradient-reduce seconds. Returns this rank's loss
// (cross-entropy + coef * aux) and aux loss, each the mean over the micro-batches, as a float64
// [2] tensor on the rank's device: not read by the host here.
torch::Tensor accumulate_gradients(CausalLM& model, TokenDataset& data, const TrainerConfig& config,
                                   int64_t accumulation_steps, TrainingOptimizer& optimizer,
                                   const DeviceMesh& mesh, StepRecorder& recorder) {
  const at::Device device = mesh.device;
  // Each micro-batch's loss and aux loss, kept on the device (float64: exact).
  std::vector<torch::Tensor> losses;
  losses.reserve(2 * accumulation_steps);
  for (int64_t micro = 0; micro < accumulation_steps; ++micro) {
    Batch batch = data.next_batch(config.data.micro_batch_size, config.data.seq_len);
    CausalLMOutput out;
    torch::Tensor loss;
    {
      PhaseTimer forward(recorder, Phase::kForward);
      // The data is read on the host; the batch moves to the rank's device through pinned
      // memory, queued on the stream without a host wait (a no-op on CPU). With context
      // parallelism this rank computes its two chunks of each sequence.
      const torch::Tensor input_ids =
          stage_to_device(context_parallel_local(batch.input_ids, mesh), device);
      const torch::Tensor labels =
          stage_to_device(context_parallel_local(batch.labels, mesh), device);
      out = model.forward(input_ids);
      // With tensor parallelism the logits are this rank's vocabulary slice: the loss is the
      // vocabulary-parallel cross-entropy.
      loss = causal_lm_cross_entropy(model, out.logits, labels) +
             moe_config(config.model).router_aux_loss_coef * out.aux_loss;
    }
    {
      // Backward reduces the gradients (FSDP's reduce-scatter, EP's all_to_all) on the thread
      // autograd picks (on CUDA a device worker thread): the mesh's counters see every thread.
      PhaseTimer backward(recorder, Phase::kBackward);
      const CollectiveStats comm_before = mesh.counters->snapshot();
      (loss * (optimizer.loss_scale() / static_cast<double>(accumulation_steps))).backward();
      optimizer.accumulate_model_grads();  // fp32 main_grad accumulation across micro-batches
      recorder.add(Phase::kReduce,
                   gradient_reduce_seconds(mesh.counters->snapshot() - comm_before));
    }
    losses.push_back(loss.detach().to(torch::kDouble));
    losses.push_back(out.aux_loss.detach().to(torch::kDouble));
  }
  // The means in micro-batch order from 0, each term divided first: the float64 arithmetic of
  // the host sum this replaces, on the device.
  const torch::Tensor values = torch::stack(losses).view({accumulation_steps, 2});
  torch::Tensor total = torch::zeros({2}, values.options());
  for (int64_t micro = 0; micro < accumulation_steps; ++micro) {
    total = total + values[micro] / static_cast<double>(accumulation_steps);
  }
  return total;
}

}  // namespace

c10::Device resolve_train_device(const TrainerConfig& config) {
  const RankInfo rank = detect_rank_info();
  try {
    return resolve_rank_device(config.train.device, rank.local_rank, rank.local_world_size);
  } catch (const std::invalid_argument& error) {
    throw ConfigError(ConfigKey{"train.device"}, error.what());
  }
}

DeviceMesh join_mesh(const TrainerConfig& config, c10::Device device) {
  RankInfo rank = detect_rank_info();
  const int64_t degrees = config.parallel.world_size();
  if (rank.world_size == 1 && degrees == 1) return make_single_process_mesh(device);
  // The one degree rule only the launched job can check (validate_config has the others).
  if (degrees != rank.world_size) {
    throw ConfigError(ConfigKey{"parallel.dp_shard"},
                      std::to_string(config.parallel.dp_shard) + " x the replicate degree " +
                          std::to_string(config.parallel.dp_replicate) + " x cp " +
                          std::to_string(config.parallel.cp) + " x tp " +
                          std::to_string(config.parallel.tp) + " = " + std::to_string(degrees) +
                          " ranks, but the launcher started " + std::to_string(rank.world_size));
  }
  set_log_rank(rank.rank);
  return make_device_mesh(rank, config.parallel, config.distributed.timeout_s, device);
}

BuiltModel build_training_model(const TrainerConfig& config, const DeviceMesh& mesh,
                                bool load_init_from) {
  const c10::ScalarType model_dtype = model_dtype_of(config);
  // Built and initialised on the CPU (the same weights on every device), then moved to the
  // rank's device before sharding: everything after this lives there.
  BuiltModel built;
  built.model = build_model(config.model, config.train.seed);
  apply_model_init_dtype(*built.model, model_dtype);
  const std::string& ac = config.train.activation_checkpointing;
  built.model->set_activation_checkpointing(ac == "full" ? 1
                                            : ac == "selective"
                                                ? config.train.activation_checkpointing_every
                                                : 0);
  if (!mesh.device.is_cpu()) built.model->to(mesh.device);
  if (mesh.rank == 0) log_info(format_model_config_block(config.model));
  // The parallelisms, as ordered steps (distributed/parallelize.h): TP, CP, EP, then
  // FSDP / HSDP / DDP. The FSDP path also serves one process whose compute dtype differs from the
  // stored one: it casts each parameter to param_dtype in forward and delivers float32 main_grads
  // in backward.
  if (mesh.world_size > 1 || parse_float_dtype(config.mix_precision.param_dtype) != model_dtype) {
    FsdpOptions fsdp;
    fsdp.mix_precision = config.mix_precision;
    fsdp.fp32_main_params = config.optimizer.fp32_main_params;
    fsdp.reshard_after_forward = config.fsdp.reshard_after_forward;
    fsdp.cp_rotate_method = config.parallel.cp_rotate_method;
    built.sharded = parallelize(*built.model, mesh, fsdp);
  }
  if (load_init_from && !config.model.init_from.empty()) {
    import_init_from(*built.model, built.sharded.get(), nullptr, config.model.init_from,
                     mesh.rank == 0);
  }
  return built;
}

Trainer::Trainer(const ResolvedConfig& resolved, const DeviceMesh& mesh, const std::string& run_dir)
    : resolved_(resolved), mesh_(mesh), run_dir_(run_dir) {
  const TrainerConfig& config = resolved_.config;
  // Also a config built in code: fp32-main-params §2.5 on every entry point.
  validate_config(resolved_);
  const c10::ScalarType model_dtype = model_dtype_of(config);
  refuse_unsupported(config, model_dtype);
  const bool is_rank0 = mesh_.rank == 0;
  if (is_rank0) {
    for (const std::string& warning : config_warnings(config)) log_warn(warning);
  }
  // LibTorch seeds its default generator nondeterministically; a run is reproducible (and its
  // checkpointed RNG state meaningful) only when seeded: train.seed + rank, one stream per rank.
  at::manual_seed(config.train.seed + static_cast<uint64_t>(mesh_.rank));

  // fp32-main-params §6.1 build order: model, then model_init_dtype, then sharding, then the
  // optimizer.
  BuiltModel built = build_training_model(config, mesh_, /*load_init_from=*/false);
  model_ = std::move(built.model);
  sharded_ = std::move(built.sharded);
  optimizer_ = build_optimizer(named_parameters_of(*model_), config, model_->param_roles());
  // Without FSDP the model's 16-bit .grad goes into the float32 main_grad param by param during
  // backward, not all at once after it (FSDP delivers main_grad itself).
  optimizer_->accumulate_model_grads_in_backward();
  if (sharded_) {
    if (config.optimizer.fp32_main_params) sharded_->set_main_grads(optimizer_.get());
    optimizer_->chained().set_placements(sharded_->placements());
  }
  if (!config.model.init_from.empty()) {
    import_init_from(*model_, sharded_.get(), optimizer_.get(), config.model.init_from, is_rank0);
  }
  if (config.optimizer.swap_optimizer) {
    // The tier follows the rank's device, where the parameters and their state are.
    const c10::Device device = mesh_.device;
    optimizer_->chained().enable_state_swap(
        make_state_swap(config.optimizer, run_dir_, mesh_.rank, device));
    if (is_rank0)
      log_info(
          "swap optimizer: optimizer state lives in " + optimizer_->chained().state_swap()->path() +
          (device.is_cpu() ? " (and the other ranks' files) " : " ") +
          "between steps, moved in buckets of " + std::to_string(config.optimizer.swap_bucket_mb) +
          " MiB, " + std::to_string(config.optimizer.swap_merge_buckets) + " per transfer");
  }
  if (!model_->model_state().empty()) {
    // deepseek_v3's balancing biases: loads counted in training forwards, updated after each
    // optimizer step.
    hooks_.push_back(std::make_unique<ModelStateHook>(*model_, mesh_));
  }
  if (muon_config(config).qk_clip_tau > 0) {
    // Every attention forward now also records its heads' max logits (one more Q K^T).
    FullyShardedModel* sharded = sharded_.get();
    hooks_.push_back(std::make_unique<QkClipHook>(
        *model_, *optimizer_, mesh_, config.model, muon_config(config).qk_clip_tau, [sharded] {
          return sharded != nullptr ? sharded->placements() : std::vector<ParamPlacement>{};
        }));
    if (is_rank0) {
      log_info(
          "QK-clip: after every step, query heads whose max attention logit (over the step's "
          "micro-batches and all ranks) exceeds tau " +
          format_number(muon_config(config).qk_clip_tau) +
          " get q_proj/k_proj rows (weights and biases) rescaled to bring it to tau, on " +
          std::string(config.optimizer.fp32_main_params ? "the fp32 main params"
                                                        : "the parameters") +
          " (optimizer " + config.optimizer.target + ")");
    }
  }
  if (muon_config(config).telemetry) {
    auto telemetry = std::make_unique<MuonTelemetryHook>(*optimizer_, mesh_);
    telemetry_ = telemetry.get();
    hooks_.push_back(std::move(telemetry));
  }
  if (is_rank0) {
    for (const OptimizerTableEntry& entry : optimizer_table()) {
      const std::string block = entry.startup_block(resolved_);
      if (!block.empty()) log_info(block);
    }
    log_info(optimizer_report_text(*optimizer_, resolved_, "after construction"));
  }

  // Data-parallel rank r reads windows r, r+n, ...: together the ranks read the global batch
  // (the cp and tp ranks of one data rank read the same windows).
  data_ = make_dataset(config.data, config.model.vocab_size, config.train.seed, mesh_.data_rank(),
                       mesh_.dp_size());
  if (is_rank0) log_info("data: " + data_->describe());
  // Opened (and every file checked) before the first step: a bad eval set fails the run now.
  if (config.train.eval_every > 0) {
    try {
      evaluator_ = std::make_unique<Evaluator>(
          config.data.eval_path, config.model.vocab_size, config.data.seq_len,
          config.data.micro_batch_size, config.data.eval_batches * config.data.global_batch_size);
    } catch (const DataError& error) {
      throw DataError(ConfigKey{"data.eval_path"}, error.problem());
    }
    if (is_rank0)
      log_info(evaluator_->describe() + ", every " + std::to_string(config.train.eval_every) +
               " steps");
  }
  accumulation_steps_ =
      config.data.global_batch_size / (config.data.micro_batch_size * mesh_.dp_size());
  schedule_ = std::make_unique<LrSchedule>(config.train.lr_scheduler, config.train.steps);

  // train.profile on a device: phases end with a device synchronisation (step_profile.h).
  if (config.train.profile && !mesh_.device.is_cpu()) {
    const c10::DeviceIndex index = mesh_.device.index();
    recorder_.set_synchronize([index] { at::accelerator::synchronizeDevice(index); });
  }

  if (!config.checkpoint.restore_from.empty()) {
    CheckpointParts parts{*model_, sharded_.get(), *optimizer_, *data_, resolved_, mesh_};
    completed_steps_ = restore_checkpoint(parts, config.checkpoint.restore_from,
                                          config.checkpoint.restore_optimizer);
    if (is_rank0) log_info(optimizer_report_text(*optimizer_, resolved_, "after the restore"));
  }
}

Trainer::~Trainer() = default;

const std::vector<MuonGroupTelemetry>& Trainer::muon_telemetry() const {
  static const std::vector<MuonGroupTelemetry> kNone;
  return telemetry_ != nullptr ? telemetry_->figures() : kNone;
}

std::string Trainer::checkpoint_dir() const {
  const std::string& dir = resolved_.config.checkpoint.dir;
  return dir.empty() ? (std::filesystem::path(run_dir_) / "checkpoints").string() : dir;
}

std::vector<StepResult> read_step_results(const std::vector<UnreadStepResult>& steps,
                                          const DeviceMesh& mesh) {
  std::vector<StepResult> results;
  if (steps.empty()) return results;
  std::vector<torch::Tensor> values;
  for (const UnreadStepResult& s : steps) values.push_back(s.values);
  // One read for every step; then one all-reduce of their losses over the world (Gloo: host
  // values).
  const torch::Tensor host = read_to_host(torch::stack(values), "step results").contiguous();
  const torch::Tensor losses = average_over_data_parallel(host.narrow(1, 0, 2), mesh);
  for (size_t i = 0; i < steps.size(); ++i) {
    StepResult r = steps[i].known;
    const auto row = static_cast<int64_t>(i);
    r.loss = losses[row][0].item<double>();  // host tensors: no wait
    r.aux_loss = losses[row][1].item<double>();
    r.grad_norm = host[row][2].item<double>();
    results.push_back(r);
  }
  return results;
}

StepResult Trainer::compute_gradients() {
  compute_gradients_unread();
  return read_step_results({pending_}, mesh_)[0];
}

UnreadStepResult Trainer::compute_gradients_unread() {
  const TrainerConfig& config = resolved_.config;
  StepResult result;
  result.step = completed_steps_ + 1;
  const double lr_factor = schedule_->factor(result.step);
  optimizer_->set_lr_factor(lr_factor);
  result.lr =
      optimizer_for_target(config.optimizer.target).reported_lr(config.optimizer) * lr_factor;

  recorder_.start();
  for (const auto& hook : hooks_) hook->before_forward(result.step);
  if (config.train.profile && !mesh_.device.is_cpu()) {
    at::accelerator::resetPeakStats(mesh_.device.index());
  }
  const torch::Tensor loss = accumulate_gradients(*model_, *data_, config, accumulation_steps_,
                                                  *optimizer_, mesh_, recorder_);
  {
    PhaseTimer prepare(recorder_, Phase::kOptimizer);
    optimizer_->prepare_grads();
  }
  torch::Tensor grad_norm;
  {
    // Over each parameter's placement: FSDP shards are disjoint over dp_shard, expert slices
    // over ep, replicas counted once.
    PhaseTimer clip(recorder_, Phase::kClip);
    grad_norm = optimizer_->chained().clip_grad_norm_unread(config.train.max_grad_norm);
  }
  pending_.known = result;
  pending_.values = torch::cat({loss, stage_to_device(grad_norm, loss.device()).reshape({1})});
  return pending_;
}

void Trainer::apply_update() {
  const TrainConfig& train = resolved_.config.train;
  const int64_t step = pending_.known.step;
  const bool log_step = is_log_step(step, train.log_every, train.steps);
  for (const auto& hook : hooks_) hook->before_update(step, log_step);
  {
    PhaseTimer timer(recorder_, Phase::kOptimizer);
    optimizer_->step_with_ready_grads();
    optimizer_->zero_grad();
    for (const auto& hook : hooks_) hook->after_update(pending_.known);  // e.g. QK-clip
  }
  // Outside the optimizer phase: the profile times the step, not (say) its telemetry.
  for (const auto& hook : hooks_) hook->after_step(step, log_step);
  if (resolved_.config.train.profile && !mesh_.device.is_cpu()) {
    // Since compute_gradients reset it; index 0 is StatType::AGGREGATE (every pool).
    recorder_.times().peak_device_bytes =
        at::accelerator::getDeviceStats(mesh_.device.index()).allocated_bytes[0].peak;
  }
  completed_steps_ = pending_.known.step;
}

EvalResult Trainer::evaluate() {
  if (!evaluator_) throw std::logic_error("Trainer::evaluate: train.eval_every is 0");
  for (const auto& hook : hooks_) hook->before_eval();
  EvalResult result = evaluator_->evaluate(*model_, mesh_);
  for (const auto& hook : hooks_) hook->after_eval();
  return result;
}

StepResult Trainer::step() {
  return read_step_results({step_unread()}, mesh_)[0];
}

UnreadStepResult Trainer::step_unread() {
  compute_gradients_unread();
  apply_update();
  return pending_;  // compute_gradients' result with apply_update's QK-clip numbers
}

void Trainer::save_checkpoint() {
  PhaseTimer save(recorder_, Phase::kCheckpoint);
  const CheckpointConfig& config = resolved_.config.checkpoint;
  if (!saver_) {
    saver_ = std::make_unique<CheckpointSaver>(checkpoint_dir(), config.keep_last, config.async,
                                               config.async ? mesh_.background : mesh_.world);
  }
  CheckpointParts parts{*model_, sharded_.get(), *optimizer_, *data_, resolved_, mesh_};
  saver_->save(make_save_request(parts, completed_steps_));
}

void Trainer::wait_for_checkpoint() {
  if (saver_) saver_->wait();
}

// Every rank stops at the same step boundary: a Ctrl-C seen by any rank stops all of them
// (otherwise the others would block in the next collective until the timeout).
// A step's row as far as the host knows it before its results are read.
static StepMetrics known_step_metrics(Trainer& trainer, const StepResult& known, double elapsed_s) {
  StepMetrics row;
  row.step = known.step;
  row.lr = known.lr;
  row.loss_scale = trainer.optimizer().loss_scale();
  row.skipped_steps = trainer.optimizer().skipped_steps();
  row.muon = trainer.muon_telemetry();
  if (known.qk_clip) row.qk_clip = QkClipMetrics{known.qk_clip_heads, known.qk_max_logit};
  row.elapsed_s = elapsed_s;
  return row;
}

static bool any_rank_interrupted(const DeviceMesh& mesh) {
  if (mesh.world_size == 1) return interrupt_requested();
  at::Tensor flag = at::full({1}, interrupt_requested() ? 1 : 0, at::kLong);
  mesh.world->all_reduce_sum(flag);
  return flag.item<int64_t>() > 0;
}

TrainSummary run_training(const ResolvedConfig& resolved, const TrainOptions& options) {
  const TrainerConfig& config = resolved.config;
  validate_config(resolved);  // before any process group exists
  refuse_unsupported(config, model_dtype_of(config));
  // Before anything starts (a process group, a file in the run directory).
  const c10::Device device = resolve_train_device(config);
  set_current_device(device);
  // Before the run's first tensor: buffers allocated earlier return to their own allocator.
  if (config.train.cpu_allocator == "caching") install_caching_cpu_allocator();
  install_interrupt_handler();
  DeviceMesh mesh = join_mesh(config, device);
  const bool is_rank0 = mesh.rank == 0;
  if (mesh.world_size > 1) check_config_agreement(mesh, format_config_show(resolved));
  configure_threads();
  if (is_rank0) {
    log_info("build:\n" + format_build_info(build_info()));
    log_info(
        "device: " + describe_device(device) +
        (mesh.world_size > 1 && device.is_cuda() ? " on rank 0 (cuda:<LOCAL_RANK> on each)" : ""));
    if (mesh.world_size > 1) {
      log_info("mesh: " + std::to_string(mesh.world_size) + " ranks = dp_replicate " +
               std::to_string(mesh.dp_replicate) + " x dp_shard " + std::to_string(mesh.dp_shard) +
               " x cp " + std::to_string(mesh.cp) + " x tp " + std::to_string(mesh.tp) + " (ep " +
               std::to_string(mesh.ep) + " inside dp_shard); " + std::to_string(mesh.dp_size()) +
               " data-parallel batch(es) per micro-step");
    }
    warn_if_reference_blas();
    warn_if_cores_are_busy();
    log_info(format_trainer_config_block(resolved));
  }
  Trainer trainer(resolved, mesh, options.run_dir);
  const CheckpointConfig& checkpoint = config.checkpoint;
  auto save_due = [&](int64_t step) {
    return checkpoint.interval > 0 &&
           (step % checkpoint.interval == 0 || step == config.train.steps);
  };

  // Only rank 0 reports (run_hook.h), in this order: metrics.jsonl, the progress line, the
  // optional features' log lines, the loss picture.
  TrainSummary summary;
  std::vector<std::unique_ptr<RunHook>> report;
  if (is_rank0) {
    auto metrics = std::make_unique<MetricsWriter>(options.run_dir, trainer.completed_steps());
    summary.metrics_path = metrics->path();
    summary.plot_path = (std::filesystem::path(options.run_dir) / "loss.svg").string();
    report.push_back(std::move(metrics));
    report.push_back(std::make_unique<ProgressBar>(config.train.steps, config.train.log_every,
                                                   options.is_terminal));
    report.push_back(std::make_unique<StepLog>(config.train.log_every, config.train.steps));
    if (config.train.profile) {
      report.push_back(std::make_unique<ProfileLog>(
          config.train.log_every, config.train.steps,
          static_cast<double>(config.data.global_batch_size) * config.data.seq_len));
    }
    report.push_back(
        std::make_unique<LossPlot>(summary.plot_path, "mixtrain loss: " + config.source_file));
  }
  auto eval_due = [&](int64_t step) {
    return config.train.eval_every > 0 &&
           (step % config.train.eval_every == 0 || step == config.train.steps);
  };
  const double tokens_per_step =
      static_cast<double>(config.data.global_batch_size) * config.data.seq_len;

  const Stopwatch run;  // elapsed_s
  const int64_t first_step = trainer.completed_steps() + 1;
  if (is_rank0 && first_step > config.train.steps) {
    log_info("nothing to train: the checkpoint has " + std::to_string(trainer.completed_steps()) +
             " steps and " + resolved.provenance.user_key("train.steps") + " is " +
             std::to_string(config.train.steps));
  }
  // Each step's row waits until its results are read: at log, save and eval steps and at the
  // end, one host read for the steps since the last (read_step_results), so a GPU step never
  // waits for the device between them. tokens_per_s: the host's seconds in the step plus an
  // equal share of that read's wait (on the CPU ~0; on a GPU the wait is the device's time the
  // host ran ahead of).
  struct UnreadRow {
    UnreadStepResult result;
    StepMetrics row;  // all but loss, aux_loss, grad_norm and tokens_per_s
    double training_s = 0.0;
  };
  std::vector<UnreadRow> unread;
  auto report_rows = [&] {
    if (unread.empty()) return;
    std::vector<UnreadStepResult> steps;
    for (const UnreadRow& u : unread) steps.push_back(u.result);
    const Stopwatch reading;
    const std::vector<StepResult> results = read_step_results(steps, mesh);  // collective
    const double wait_share = reading.seconds() / static_cast<double>(unread.size());
    for (size_t i = 0; i < unread.size(); ++i) {
      StepMetrics row = unread[i].row;
      row.loss = results[i].loss;
      row.aux_loss = results[i].aux_loss;
      row.grad_norm = results[i].grad_norm;
      row.tokens_per_s = tokens_per_step / (unread[i].training_s + wait_share);
      if (row.step == first_step) summary.first_loss = row.loss;
      summary.last_loss = row.loss;
      for (const auto& hook : report) hook->on_step(row);
    }
    unread.clear();
  };
  // train.count_ops: this thread's ops and allocations, and those of the threads it hands work
  // to (autograd's device threads), from here to the end of the loop.
  std::optional<OpCountScope> counting;
  if (config.train.count_ops) counting.emplace();
  try {
    for (int64_t step = first_step; step <= config.train.steps; ++step) {
      const Stopwatch iteration;  // the profile's step_s: the whole iteration, its save included
      // train.count_ops: where this step's counts start (read only when counting).
      const OpCounts ops_before = counting ? op_counts() : OpCounts{};
      const int64_t collectives_before =
          counting ? mesh.counters->snapshot().total().calls : int64_t{0};
      if (any_rank_interrupted(mesh)) {
        summary.interrupted = true;
        break;
      }
      const Stopwatch training;  // tokens_per_s: the training step alone
      const UnreadStepResult result = trainer.step_unread();
      const double training_s = training.seconds();
      StepMetrics row = known_step_metrics(trainer, result.known, run.seconds());
      summary.steps_completed = step;
      if (save_due(step)) {
        report_rows();              // the earlier steps' rows first: a failed save leaves them
        trainer.save_checkpoint();  // recorded as the step's checkpoint phase
      }
      // The row is taken after the save, so that the profile counts the checkpoint in its step.
      if (config.train.profile) {
        StepTimes times = trainer.last_step_times();
        times.step_s = iteration.seconds();
        row.profile = times;
      }
      if (counting) {
        StepOps ops = trainer.last_step_ops();
        ops.step = op_counts() - ops_before;
        ops.collectives = mesh.counters->snapshot().total().calls - collectives_before;
        row.ops = ops;
      }
      unread.push_back(UnreadRow{result, std::move(row), training_s});
      if (is_log_step(step, config.train.log_every, config.train.steps) || save_due(step) ||
          eval_due(step)) {
        report_rows();
      }
      // After the step's row: its tokens_per_s and profile do not count the evaluation.
      if (eval_due(step)) {
        const EvalResult eval = trainer.evaluate();  // collective: every rank
        const EvalMetrics row{step, eval.loss(), eval.perplexity(), eval.tokens};
        for (const auto& hook : report) hook->on_eval(row, eval);
      }
    }
  } catch (...) {
    // One process: the rows of the steps before the error are still written (the read needs
    // no peer). With several ranks the read is collective, and a rank that failed alone cannot
    // make it: rows since the last log, save or eval step are lost with the run.
    if (mesh.world_size == 1) {
      try {
        report_rows();
      } catch (const std::exception&) {
        // The first error is the one to report.
      }
    }
    throw;
  }
  report_rows();                  // the steps before an interruption
  trainer.wait_for_checkpoint();  // an async save finishes (or reports its error) before exit
  for (const auto& hook : report) hook->on_end();
  if (is_rank0 && counting) {
    std::string line = "op counts: the most dispatched ops of the run:";
    const char* separator = " ";
    for (const auto& [name, count] : most_counted_ops(12)) {
      line += separator + name + " " + std::to_string(count);
      separator = ", ";
    }
    log_info(line);
  }
  if (is_rank0 && config.train.profile && config.train.cpu_allocator == "caching") {
    log_info(format_cpu_allocator_stats(CachingCpuAllocator::instance().stats()));
  }
  return summary;
}

}  // namespace mixtrain
