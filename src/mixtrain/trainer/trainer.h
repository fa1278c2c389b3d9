// The training loop (docs/architecture.md §3, fp32-main-params §6.1-6.2).
//
// Trainer builds, in the order of fp32-main-params §6.1: model, model_init_dtype, sharding
// (FSDP/HSDP/DDP/EP when the mesh has several ranks, or when the compute dtype differs from the
// stored one), the optimizer stack, model.init_from's Hugging Face weights into each rank's
// pieces (checkpoint/hf_import.h; into the fp32 main params where there are, the model params
// their rounding), the data stream, and then, with checkpoint.restore_from,
// restores the checkpoint (model, then model_init_dtype, then optimizer; trainer/checkpointing.h).
// One step() = micro-batches with gradient accumulation (cross-entropy + router aux loss),
// prepare_grads, global grad-norm clipping, the scheduled LR, the optimizer step, zero_grad.
// Tests drive the two halves separately (compute_gradients, apply_update) to look at the
// gradients in between.
//
// run_training() is `mixtrain train`: joins the ranks, runs Trainer::step() to train.steps,
// saves checkpoints every checkpoint.interval steps and at the last step, and writes (rank 0)
// <run_dir>/metrics.jsonl (one JSON object per step, flushed per line) and loss.svg (at the
// end, also after Ctrl-C). With train.profile it adds each step's phase times (step_profile.h)
// to metrics.jsonl and logs their average every train.log_every steps. With
// optimizer.muon_telemetry it adds Muon's figures (optim/muon_telemetry.h) to the rows and the
// log of the log steps (every train.log_every-th and the last) and computes them on those steps
// only. With train.eval_every it evaluates data.eval_path (trainer/evaluator.h) every eval_every
// steps and at the last one, after that step's row, and rank 0 adds an eval row (metrics_writer.h)
// and the eval series of loss.svg; the evaluation reads neither the RNG nor the training data, so
// the training run is the same with and without it. Inside the Trainer the optional features
// of a step are step hooks (step_hook.h); what run_training reports goes through run hooks
// (run_hook.h), so both loops read as the algorithm.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/config/load.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/optim/muon_telemetry.h"
#include "mixtrain/trainer/evaluator.h"
#include "mixtrain/trainer/step_recorder.h"

namespace mixtrain {

class CausalLM;
class FullyShardedModel;
class TrainingOptimizer;
class TokenDataset;
class LrSchedule;
class CheckpointSaver;
class StepHook;
class MuonTelemetryHook;

// The model as the trainer builds it (fp32-main-params §6.1): built and initialised on the CPU
// from config.model and train.seed, model_init_dtype applied, moved to mesh.device, then sharded
// (FSDP / HSDP / DDP, expert parallelism with parallel.ep > 1) when the mesh has several ranks or
// the compute dtype (mix_precision.param_dtype) differs from the stored one; sharded is null
// otherwise. With load_init_from and model.init_from set, the Hugging Face weights are then read
// into each rank's pieces (the Trainer passes false and loads them after building the optimizer,
// into the fp32 main params where there are). `mixtrain eval` builds its model with it too.
struct BuiltModel {
  std::shared_ptr<CausalLM> model;
  std::shared_ptr<FullyShardedModel> sharded;
};
BuiltModel build_training_model(const TrainerConfig& config, const DeviceMesh& mesh,
                                bool load_init_from = true);

struct StepResult {
  int64_t step = 0;        // the step just computed (1-based)
  double loss = 0.0;       // mean over micro-batches and data-parallel ranks
  double aux_loss = 0.0;   // likewise
  double grad_norm = 0.0;  // global L2 norm before clipping
  double lr = 0.0;         // the target's reported base lr (optimizer table) x schedule factor
  // QK-clip (optimizer.muon_config.muon_qk_clip_tau > 0), filled by apply_update: query heads
  // clipped after this step and the max attention logit over all heads and ranks.
  bool qk_clip = false;
  int64_t qk_clip_heads = 0;
  double qk_max_logit = 0.0;
};

// A step's results as the step left them, before the host reads them (on a GPU a read waits for
// the step's kernels): `known` holds what the host already has (step, lr, QK-clip figures);
// `values` this rank's loss and aux loss (means over its micro-batches) and the global grad
// norm, float64 [3] on the rank's device.
struct UnreadStepResult {
  StepResult known;
  at::Tensor values;
};

// The StepResults of `steps`, in order: one host read for all of them, then one all-reduce of
// their losses over mesh.world (the mean over data-parallel ranks, as
// average_over_data_parallel). Collective over mesh.world: every rank passes the same steps.
std::vector<StepResult> read_step_results(const std::vector<UnreadStepResult>& steps,
                                          const DeviceMesh& mesh);

class Trainer {
 public:
  // `run_dir` anchors the default checkpoint.dir (<run_dir>/checkpoints).
  Trainer(const ResolvedConfig& resolved, const DeviceMesh& mesh, const std::string& run_dir);
  ~Trainer();

  // compute_gradients() then apply_update(); the results read (a host wait on a GPU).
  StepResult step();
  // The same, its results left unread: the training loop reads them at log steps only.
  UnreadStepResult step_unread();
  // Forward/backward over the step's micro-batches, prepare_grads, clipping. Collective.
  StepResult compute_gradients();
  UnreadStepResult compute_gradients_unread();
  void apply_update();
  // optimizer.muon_telemetry: the figures of the last step if it was a log step (every
  // train.log_every-th and the last), else empty. Computed inside apply_update (collective on those
  // steps).
  const std::vector<MuonGroupTelemetry>& muon_telemetry() const;
  // The phase times of the last step: compute_gradients() restarts them and fills forward,
  // backward, reduce, clip (and its prepare_grads into optimizer); apply_update() adds the
  // optimizer step; save_checkpoint() after it adds checkpoint. step_s is run_training's to fill.
  const StepTimes& last_step_times() const { return recorder_.times(); }
  // Its op counts by phase the same way (zero unless an OpCountScope is active; step and
  // collectives are run_training's to fill).
  const StepOps& last_step_ops() const { return recorder_.ops(); }

  // The eval loss of the current model over data.eval_path (train.eval_every > 0 only;
  // std::logic_error otherwise). Collective over the mesh.
  EvalResult evaluate();

  // Steps completed (restored ones included).
  int64_t completed_steps() const { return completed_steps_; }
  // Saves a checkpoint of the current state as step completed_steps() (collective; async per
  // checkpoint.async). wait_for_checkpoint() joins an async save and rethrows its error.
  void save_checkpoint();
  void wait_for_checkpoint();
  std::string checkpoint_dir() const;

  const ResolvedConfig& resolved() const { return resolved_; }
  const DeviceMesh& mesh() const { return mesh_; }
  CausalLM& model() { return *model_; }
  FullyShardedModel* sharded() { return sharded_.get(); }  // null: whole parameters
  TrainingOptimizer& optimizer() { return *optimizer_; }
  TokenDataset& data() { return *data_; }

 private:
  ResolvedConfig resolved_;
  DeviceMesh mesh_;
  std::string run_dir_;
  std::shared_ptr<CausalLM> model_;
  std::shared_ptr<FullyShardedModel> sharded_;
  std::unique_ptr<TrainingOptimizer> optimizer_;
  std::unique_ptr<TokenDataset> data_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<CheckpointSaver> saver_;
  std::unique_ptr<Evaluator> evaluator_;  // train.eval_every > 0
  int64_t accumulation_steps_ = 1;
  int64_t completed_steps_ = 0;
  UnreadStepResult pending_;  // compute_gradients' result until apply_update
  StepRecorder recorder_;     // the phase times of the step in flight / last completed
  // The optional features around each step (step_hook.h), in installation order.
  std::vector<std::unique_ptr<StepHook>> hooks_;
  MuonTelemetryHook* telemetry_ = nullptr;  // one of hooks_ with optimizer.muon_telemetry
};

struct TrainOptions {
  std::string run_dir;
  bool is_terminal = false;  // progress bar redrawn in place vs. plain log lines
};

struct TrainSummary {
  int64_t steps_completed = 0;
  bool interrupted = false;
  double first_loss = 0.0;
  double last_loss = 0.0;
  std::string metrics_path;
  std::string plot_path;
};

// This rank's device: train.device for the launcher's LOCAL_RANK and LOCAL_WORLD_SIZE
// (core/device.h); a device it cannot use is a ConfigError on train.device.
c10::Device resolve_train_device(const TrainerConfig& config);

// The process groups of this run on `device`: one process unless a launcher set the rank
// variables.
DeviceMesh join_mesh(const TrainerConfig& config, c10::Device device = c10::kCPU);

TrainSummary run_training(const ResolvedConfig& resolved, const TrainOptions& options);

}  // namespace mixtrain
