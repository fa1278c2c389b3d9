#include "mixtrain/trainer/checkpointing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "mixtrain/checkpoint/storage.h"
#include "mixtrain/config/model_sections.h"
#include "mixtrain/config/schema.h"
#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/core/printable.h"
#include "mixtrain/core/text.h"
#include "mixtrain/data/dataset.h"
#include "mixtrain/distributed/fsdp.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/model/init_dtype.h"
#include "mixtrain/optim/chained_optimizer.h"
#include "mixtrain/optim/loss_scaler.h"
#include "mixtrain/optim/training_optimizer.h"
#include "mixtrain/trainer/checkpoint_state.h"

namespace mixtrain {
namespace {

using json = nlohmann::json;

constexpr const char* kModelPrefix = "model.";

// The model parameter a checkpoint key belongs to.
std::string fqn_of(const std::string& key) {
  if (starts_with(key, kMainParamPrefix)) return key.substr(std::string(kMainParamPrefix).size());
  if (starts_with(key, kOptimizerStatePrefix)) {
    const std::string rest = key.substr(std::string(kOptimizerStatePrefix).size());
    return rest.substr(0, rest.rfind('.'));
  }
  return key.substr(std::string(kModelPrefix).size());
}

// Where this rank's `local` piece of `key` sits in the global tensor: the parameter's box
// (ParamPlacement::global_offsets: FSDP rows or expert slice of its tensor-parallel slice; its
// optimizer state and main param alike; per-row state: the box without the last dim), whole
// otherwise; 0-dim state (step counters) is the
// same on every rank. Pieces held alike by several ranks (replicas, tp_dim -1 on every tp
// rank) have the same box and are written once.
LocalChunk place(const FullyShardedModel* sharded, const std::string& key,
                 const at::Tensor& local) {
  LocalChunk chunk{key, local, local.sizes().vec(), std::vector<int64_t>(local.dim(), 0)};
  if (local.dim() == 0 || sharded == nullptr) return chunk;
  const ParamPlacement& placement = sharded->placement(fqn_of(key));
  std::vector<int64_t> box = placement.local_sizes();
  chunk.global_shape = placement.global_shape;
  chunk.offsets = placement.global_offsets();
  // Per-row state (StateField::kPerRow, NorMuon's normuon_v): the box without its last dim, so
  // its rows sit where the parameter's rows do (a tp split of the last dim leaves every tp rank
  // the same rows: one box, written once).
  if (local.dim() + 1 == static_cast<int64_t>(box.size())) {
    box.pop_back();
    chunk.global_shape.pop_back();
    chunk.offsets.pop_back();
  }
  TORCH_CHECK(local.sizes() == at::IntArrayRef(box), "checkpoint: ", key, " holds ", local.sizes(),
              " but its placement's box is ", at::IntArrayRef(box));
  return chunk;
}

std::vector<std::pair<std::string, at::Tensor>> model_tensors(const CausalLM& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters()) {
    out.emplace_back(kModelPrefix + item.key(), item.value());
  }
  return out;
}

// The model's own state (CausalLM::model_state: deepseek_v3's selection biases), float32 and
// whole on every rank, under model.<name> beside the parameters.
std::vector<std::pair<std::string, at::Tensor>> model_state_tensors(CausalLM& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, tensor] : model.model_state())
    out.emplace_back(kModelPrefix + name, tensor);
  return out;
}

json config_json(const ResolvedConfig& resolved) {
  json out = json::object();
  for (const auto& leaf : resolved.leaves) out[leaf.key] = leaf.value;
  return out;
}

// What makes a checkpoint "of this model": the architecture. The stored precision may change
// (fp32-main-params §6.2: model_init_dtype is applied after loading).
bool is_model_key(const std::string& key) {
  return starts_with(key, "model.");
}

// Every rank's problems joined; the same DataError on every rank when any has one.
void agree_or_throw(const DeviceMesh& mesh, const std::string& dir,
                    const std::vector<std::string>& problems) {
  std::string mine;
  for (const auto& p : problems) mine += "  - " + p + "\n";
  const std::vector<std::string> all = all_gather_strings(*mesh.world, mine);
  std::string message;
  std::set<std::string> seen;  // ranks often report the same problem
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty() || !seen.insert(all[r]).second) continue;
    message += (all.size() > 1 ? "rank " + std::to_string(r) + ":\n" : "") + all[r];
  }
  if (!message.empty()) {
    // Keys and values come from the checkpoint's files: printable, never raw bytes.
    throw DataError(printable("checkpoint " + dir + " cannot be restored (nothing was changed):\n" +
                                  message.substr(0, message.size() - 1),
                              /*keep_newlines=*/true));
  }
}

// Optimizer state tensors cast on load, and from which dtype to which ("bfloat16 to float32").
struct Casts {
  int64_t count = 0;
  std::set<std::string> pairs;
  void add(const std::string& pair) {
    ++count;
    pairs.insert(pair);
  }
  std::string kinds() const {
    std::string out;
    for (const auto& pair : pairs) out += (out.empty() ? "" : ", ") + pair;
    return out;
  }
};

// Which saved dtype a tensor accepts: model params any (model_init_dtype converts them,
// fp32-main-params §6.2), optimizer state one it can be cast to (state_dtype_loads_into), a
// count (step) any real one (its leaf checks the value: LeafOptimizer::check_state), main
// params exactly.
enum class DtypeRule { kAny, kOptimizerState, kCount, kExact };

// Reads this rank's region of `key` into `out`, or records why it cannot.
void read_piece(CheckpointReader& reader, const LocalChunk& target, DtypeRule rule,
                std::map<std::string, at::Tensor>& out, std::vector<std::string>& problems) {
  const auto it = reader.metadata().tensors.find(target.key);
  if (it == reader.metadata().tensors.end()) {
    problems.push_back("missing key " + target.key);
    return;
  }
  const CheckpointTensor& saved = it->second;
  if (saved.shape != target.global_shape) {
    problems.push_back(target.key + ": shape " + format_list(saved.shape) + " in the checkpoint, " +
                       format_list(target.global_shape) + " in this model");
    return;
  }
  const c10::ScalarType live = target.data.scalar_type();
  const bool accepted =
      rule == DtypeRule::kAny || (rule == DtypeRule::kCount && saved.dtype != at::kBool) ||
      (rule == DtypeRule::kExact ? saved.dtype == live : state_dtype_loads_into(saved.dtype, live));
  if (!accepted) {
    problems.push_back(target.key + ": dtype " + dtype_name(saved.dtype) + " in the checkpoint, " +
                       dtype_name(target.data.scalar_type()) + " expected");
    return;
  }
  try {
    out[target.key] = reader.read(target.key, target.offsets, target.data.sizes().vec());
  } catch (const std::exception& error) {
    problems.push_back(error.what());
  }
}

// Everything a restore will do, read and checked without changing anything. No problems
// (on any rank): apply_restore cannot fail on data.
struct RestorePlan {
  std::string dir;
  std::unique_ptr<CheckpointReader> reader;
  SavedTrainingState saved;
  bool another_model = false;
  std::vector<std::string> config_changes;         // "key: <saved> in the checkpoint, <now> now"
  std::map<std::string, at::Tensor> model_values;  // model.<fqn> -> the value it gets
  std::set<std::string> main_params_as_model;      // main-param keys read as float32 values
  NamedTensors optimizer_state;
  // Optimizer state saved in another floating dtype (cast on load) and main params not used.
  Casts widened, narrowed;
  int64_t dropped_mains = 0;
  ChainedOptimizer::ParamGroupsPlan groups;
  std::vector<std::string> problems;
};

std::string metadata_path(const RestorePlan& plan) {
  return (std::filesystem::path(plan.dir) / kCheckpointMetadataFile).string();
}

// Whether the checkpoint is of this model: its recorded config against `resolved`'s leaves.
void plan_config(const ResolvedConfig& resolved, RestorePlan& plan) {
  if (!plan.saved.unread_parts.count("config")) {
    const json current_config = config_json(resolved);
    for (const auto& [key, value] : current_config.items()) {
      const auto recorded = plan.saved.config.find(key);
      const std::string before =
          recorded != plan.saved.config.end() ? recorded->second : "(absent)";
      if (before == value.get<std::string>()) continue;
      const std::string line =
          key + ": " + before + " in the checkpoint, " + value.get<std::string>() + " now";
      // A model.* key the model does not read (another model's section), or one added since
      // the checkpoint was written (absent there) that has its default now (e.g. the rope
      // scaling keys: none), says nothing about the architecture.
      const LeafSpec* leaf = find_canonical_leaf(key);
      const bool newer_at_default = recorded == plan.saved.config.end() && leaf != nullptr &&
                                    value.get<std::string>() == leaf->format(TrainerConfig{});
      if (is_model_key(key) && model_reads_key(resolved.config.model.name, key) &&
          !newer_at_default) {
        plan.problems.push_back("the checkpoint is of another model: " + line);
        plan.another_model = true;
      } else {
        plan.config_changes.push_back(line);
      }
    }
  }
}

// The non-tensor state, checked completely (checkpoint_state.h); the data position checked by
// the dataset itself: seek() refuses a position it cannot resume at before it changes
// anything, and the current position is put back at once. Then whether the checkpoint is of
// this model (plan_config) and holds what the restore needs.
void plan_training_state(const CheckpointParts& parts, bool restore_optimizer, RestorePlan& plan) {
  const std::string where = metadata_path(plan);
  plan.saved = read_training_state(plan.reader->metadata(), where, plan.problems);
  const SavedTrainingState& saved = plan.saved;
  if (!saved.unread_parts.count("data")) {
    const int64_t current = parts.data.position();
    try {
      parts.data.seek(saved.data_position);
      parts.data.seek(current);
    } catch (const DataError& error) {
      plan.problems.push_back(where + ": state.data.position: " + error.what());
    }
  }

  plan_config(parts.resolved, plan);
  if (restore_optimizer && !saved.unread_parts.count("optimizer") && !saved.optimizer_saved) {
    // The remedy in the dialect of the config being run (TOML's key is the negation).
    const std::string model_only = parts.resolved.config.dialect == "toml"
                                       ? "checkpoint.initial_load_model_only = true"
                                       : "checkpoint.restore_optimizer: false";
    plan.problems.push_back(
        "it has no optimizer state (saved with checkpoint.save_optimizer: false); set " +
        model_only + " to restore the model only");
  }
}

// Every model tensor's value, and the keys the model does not have.
void plan_model(CausalLM& live, const FullyShardedModel* sharded, RestorePlan& plan) {
  CheckpointReader& reader = *plan.reader;
  const CheckpointMetadata& metadata = reader.metadata();
  const auto model = model_tensors(live);
  // The model's state: exactly as saved (float32), whole.
  const auto state = model_state_tensors(live);
  for (const auto& [key, tensor] : state) {
    read_piece(reader, place(nullptr, key, tensor), DtypeRule::kExact, plan.model_values,
               plan.problems);
  }
  for (const auto& [key, tensor] : model) {
    // A float32 parameter saved by a run with a bfloat16/float16 model and fp32 main params: its
    // exact value is that main param, not the rounded model param.
    const std::string main_key = kMainParamPrefix + fqn_of(key);
    const auto saved = metadata.tensors.find(key);
    if (tensor.scalar_type() == at::kFloat && reader.contains(main_key) &&
        saved != metadata.tensors.end() && saved->second.dtype != at::kFloat) {
      std::map<std::string, at::Tensor> read;
      read_piece(reader, place(sharded, main_key, tensor.detach()), DtypeRule::kExact, read,
                 plan.problems);
      if (read.count(main_key) != 0) plan.model_values[key] = read.at(main_key);
      plan.main_params_as_model.insert(main_key);
      continue;
    }
    // The model is saved in its model dtype and converted by model_init_dtype (fp32-main-params
    // §6.2).
    read_piece(reader, place(sharded, key, tensor.detach()), DtypeRule::kAny, plan.model_values,
               plan.problems);
  }
  for (const auto& [key, saved] : metadata.tensors) {
    const auto is_key = [&](const auto& m) { return m.first == key; };
    if (starts_with(key, kModelPrefix) && std::none_of(model.begin(), model.end(), is_key) &&
        std::none_of(state.begin(), state.end(), is_key)) {
      plan.problems.push_back("unexpected key " + key +
                              " (no such parameter or model state in this model)");
    }
  }
}

// Every optimizer state tensor (the state exists: ChainedOptimizer::initialize_state), which
// main-param branch applies (fp32-main-params §9.3), the keys this optimizer does not have, the
// values as the leaves check them, and the param-group hyper-parameters.
void plan_optimizer(const CheckpointParts& parts, RestorePlan& plan) {
  CheckpointReader& reader = *plan.reader;
  const ChainedOptimizer& chained = parts.optimizer.chained();
  const size_t problems_before = plan.problems.size();
  std::map<std::string, at::Tensor> loaded;
  std::set<std::string> expected;
  std::vector<std::string> main_keys, missing_mains;
  for (const auto& [key, tensor] : parts.optimizer.state_dict()) {
    expected.insert(key);
    const bool is_main = starts_with(key, kMainParamPrefix);
    if (is_main) {
      main_keys.push_back(key);
      if (!reader.contains(key)) {
        missing_mains.push_back(fqn_of(key));
        continue;  // the branch is decided below
      }
    }
    const std::string fqn = fqn_of(key);
    const bool is_count = !is_main && chained.contains(fqn) &&
                          chained.leaf_of(fqn).is_count_field(key.substr(key.rfind('.') + 1));
    read_piece(reader, place(parts.sharded, key, tensor),
               is_main    ? DtypeRule::kExact
               : is_count ? DtypeRule::kCount
                          : DtypeRule::kOptimizerState,
               loaded, plan.problems);
    if (!loaded.count(key)) continue;
    plan.optimizer_state.emplace_back(key, loaded.at(key));
    const c10::ScalarType saved = loaded.at(key).scalar_type();
    if (saved != tensor.scalar_type() && !is_count) {
      const bool widens = c10::elementSize(saved) < c10::elementSize(tensor.scalar_type());
      (widens ? plan.widened : plan.narrowed)
          .add(dtype_name(saved) + " to " + dtype_name(tensor.scalar_type()));
    }
  }
  // fp32-main-params §9.3 branch 3: some main params but not all is damaged data.
  if (!missing_mains.empty() && missing_mains.size() < main_keys.size()) {
    std::string names;
    for (const auto& n : missing_mains) names += (names.empty() ? "" : ", ") + n;
    plan.problems.push_back("it has " + std::to_string(main_keys.size() - missing_mains.size()) +
                            " of " + std::to_string(main_keys.size()) + " fp32 main params (" +
                            kMainParamPrefix + "*); missing: " + names);
  }
  for (const auto& [key, saved] : reader.metadata().tensors) {
    if (!starts_with(key, "optimizer.") || expected.count(key) ||
        plan.main_params_as_model.count(key)) {
      continue;
    }
    // A main-params checkpoint resumed with fp32_main_params off: the model continues from
    // its low-precision params (the rounded main params, as saved); the main params go.
    if (starts_with(key, kMainParamPrefix) && main_keys.empty() && chained.contains(fqn_of(key)) &&
        is_low_precision(chained.model_param(fqn_of(key)).scalar_type())) {
      ++plan.dropped_mains;
      continue;
    }
    plan.problems.push_back("unexpected key " + key + " (no such state in this optimizer)");
  }
  // The values (a step that is no whole number >= 0) once every tensor is there to check.
  if (plan.problems.size() == problems_before) {
    for (const auto& problem : parts.optimizer.check_state_dict(plan.optimizer_state)) {
      plan.problems.push_back(problem);
    }
  }
  if (!plan.saved.unread_parts.count("optimizer")) {
    plan.groups = chained.plan_param_groups(plan.saved.param_groups);
    if (!plan.groups.ok()) {
      plan.problems.push_back(metadata_path(plan) +
                              ": state.optimizer.param_groups: " + plan.groups.error());
    }
  }
}

// The model's values, then model_init_dtype (fp32-main-params §6.2).
void apply_model_values(CausalLM& model, const TrainerConfig& config, const RestorePlan& plan) {
  {
    c10::NoGradGuard no_grad;
    for (const auto& [key, tensor] : model_tensors(model)) {
      tensor.detach().copy_(plan.model_values.at(key));
    }
    for (const auto& [key, tensor] : model_state_tensors(model)) {
      model.set_model_state(key.substr(std::string(kModelPrefix).size()),
                            plan.model_values.at(key));
    }
  }
  if (config.model_init_dtype) {
    apply_model_init_dtype(model, parse_float_dtype(*config.model_init_dtype));
  }
}

// Changes everything, in the order of fp32-main-params §6.2; every value was checked by the plan.
void apply_restore(const CheckpointParts& parts, bool restore_optimizer, RestorePlan& plan,
                   std::vector<std::string>& group_changes) {
  const TrainerConfig& config = parts.resolved.config;
  if (restore_optimizer) {
    group_changes = parts.optimizer.chained().apply_param_groups(std::move(plan.groups));
  }
  apply_model_values(parts.model, config, plan);
  const SavedTrainingState& saved = plan.saved;
  if (restore_optimizer) {
    parts.optimizer.load_state_dict(
        plan.optimizer_state);  // fp32-main-params §9.3 branches 1 and 2
    DynamicLossScaler* scaler = parts.optimizer.loss_scaler();
    if (scaler != nullptr && saved.loss_scaler) {
      const SavedLossScaler& s = *saved.loss_scaler;
      scaler->restore(s.scale, s.growth_tracker, s.skipped_steps);
    }
  } else {
    parts.optimizer
        .reload_model_params();  // fp32-main-params §9.4: main params from the loaded model
  }
  parts.data.seek(saved.data_position);
  if (saved.rng_cpu.size() == static_cast<size_t>(parts.mesh.world_size)) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(saved.rng_cpu.at(parts.mesh.rank));
  }
}

// The step directory and its reader; a rank that fails here fails alone only if the others
// fail too (they read the same files), so agree.
void open_checkpoint(const std::string& restore_from, const DeviceMesh& mesh, RestorePlan& plan) {
  plan.dir = restore_from;
  try {
    plan.dir = resolve_step_dir(restore_from);
    plan.reader = std::make_unique<CheckpointReader>(plan.dir);
  } catch (const std::exception& error) {
    plan.problems.push_back(error.what());
  }
  agree_or_throw(mesh, plan.dir, plan.problems);
}

}  // namespace

SaveRequest make_save_request(const CheckpointParts& parts, int64_t step) {
  const TrainerConfig& config = parts.resolved.config;
  SaveRequest request;
  request.step = step;
  request.mesh = CheckpointMesh{parts.mesh.dp_replicate, parts.mesh.dp_shard, parts.mesh.ep,
                                parts.mesh.cp, parts.mesh.tp};
  for (const auto& [key, tensor] : model_tensors(parts.model)) {
    request.chunks.push_back(place(parts.sharded, key, tensor.detach()));
  }
  // Whole and equal on every rank (written once); copied, as an asynchronous save may write
  // while the next step updates the state.
  for (const auto& [key, tensor] : model_state_tensors(parts.model)) {
    request.chunks.push_back(place(nullptr, key, tensor.detach().clone()));
  }
  const bool with_optimizer = config.checkpoint.save_optimizer;
  if (with_optimizer) {
    for (const auto& [key, tensor] : parts.optimizer.state_dict()) {
      request.chunks.push_back(place(parts.sharded, key, tensor));
    }
  }

  const std::string config_text = config_json(parts.resolved).dump();
  json state;
  state["train"] = {{"step", step}};
  const LrSchedulerConfig& lr = config.train.lr_scheduler;
  state["lr_schedule"] = {{"warmup_steps", lr.warmup_steps},
                          {"decay", lr.decay},
                          {"min_lr_ratio", lr.min_lr_ratio},
                          {"total_steps", config.train.steps}};
  state["data"] = {{"position", parts.data.position()}, {"description", parts.data.describe()}};
  if (const DynamicLossScaler* scaler = parts.optimizer.loss_scaler()) {
    state["loss_scaler"] = {{"scale", scaler->scale()},
                            {"growth_tracker", scaler->growth_tracker()},
                            {"skipped_steps", scaler->skipped_steps()}};
  }
  state["optimizer"] = {{"saved", with_optimizer},
                        {"fp32_main_params", config.optimizer.fp32_main_params},
                        {"param_groups", parts.optimizer.chained().param_groups_state()}};
  state["config"] = config_json(parts.resolved);
  state["config_hash"] = format_xxh3_64(XXH3_64bits(config_text.data(), config_text.size()));
  request.state = std::move(state);
  request.rank_state = {{"rng_cpu", cpu_rng_state_hex()}};
  return request;
}

int64_t restore_checkpoint(const CheckpointParts& parts, const std::string& restore_from,
                           bool restore_optimizer) {
  // Plan: read and check everything, collecting every problem, changing nothing. Opening the
  // metadata and files comes first (nothing can be planned without them).
  RestorePlan plan;
  open_checkpoint(restore_from, parts.mesh, plan);
  plan_training_state(parts, restore_optimizer, plan);

  // fp32-main-params §9.2: the optimizer state must exist so that it can be checked and filled in
  // place. Collective (distributed Muon steps together): every rank does it here, whatever its plan
  // holds so far, and drops it again if the restore is refused.
  ChainedOptimizer::StateInitialization created;
  if (restore_optimizer) created = parts.optimizer.chained().initialize_state();
  try {
    // The tensors of another model (or of a checkpoint without the optimizer state asked
    // for) would each differ as a consequence: the plan names the cause only.
    if (!plan.another_model) {
      plan_model(parts.model, parts.sharded, plan);
      if (restore_optimizer && plan.saved.optimizer_saved) plan_optimizer(parts, plan);
    }
    // Agree: every rank's plan is good before any rank changes anything.
    agree_or_throw(parts.mesh, plan.dir, plan.problems);
  } catch (...) {
    if (restore_optimizer) parts.optimizer.chained().undo_initialize_state(created);
    throw;
  }

  std::vector<std::string> group_changes;
  apply_restore(parts, restore_optimizer, plan, group_changes);

  const CheckpointMetadata& metadata = plan.reader->metadata();
  const std::string& dir = plan.dir;
  const auto& main_params_as_model = plan.main_params_as_model;
  const Casts& widened = plan.widened;
  const Casts& narrowed = plan.narrowed;
  const int64_t dropped_mains = plan.dropped_mains;
  const auto& config_changes = plan.config_changes;
  const int64_t step = plan.saved.step;
  if (parts.mesh.rank == 0) {
    log_info("checkpoint: restored step " + std::to_string(step) + " from " + dir + " (saved by " +
             std::to_string(metadata.world_size) + " rank(s), restored on " +
             std::to_string(parts.mesh.world_size) + ")" +
             (restore_optimizer ? "" : "; model only, optimizer state starts fresh"));
    if (!main_params_as_model.empty()) {
      log_info("checkpoint: " + std::to_string(main_params_as_model.size()) +
               " float32 parameters take their values from the checkpoint's fp32 main params "
               "(exact), not from its rounded model params");
    }
    if (widened.count > 0) {
      log_info("checkpoint: " + std::to_string(widened.count) +
               " optimizer state tensors widened (" + widened.kinds() + ", exact)");
    }
    if (dropped_mains > 0 || narrowed.count > 0) {
      std::string lost;
      if (dropped_mains > 0) {
        lost = "fp32_main_params is off: the checkpoint's " + std::to_string(dropped_mains) +
               " fp32 main params are not used (the model continues from its low-precision "
               "params, their rounded values)";
      }
      if (narrowed.count > 0) {
        lost += (lost.empty() ? "" : "; ") + std::to_string(narrowed.count) +
                " optimizer state tensors are rounded (" + narrowed.kinds() + ")";
      }
      log_warn("checkpoint: " + lost +
               "; the mantissa bits the lower precision cannot hold are lost");
    }
    for (const auto& line : config_changes) log_info("checkpoint: config changed: " + line);
    for (const auto& line : group_changes) {
      log_warn("checkpoint: optimizer hyper-parameter restored from the checkpoint: " + line);
    }
  }
  return step;
}

int64_t restore_model_weights(CausalLM& model, FullyShardedModel* sharded,
                              const ResolvedConfig& resolved, const DeviceMesh& mesh,
                              const std::string& restore_from) {
  RestorePlan plan;
  open_checkpoint(restore_from, mesh, plan);
  plan.saved = read_training_state(plan.reader->metadata(), metadata_path(plan), plan.problems);
  plan_config(resolved, plan);
  if (!plan.another_model) plan_model(model, sharded, plan);
  agree_or_throw(mesh, plan.dir, plan.problems);
  apply_model_values(model, resolved.config, plan);
  if (mesh.rank == 0) {
    log_info("checkpoint: model weights of step " + std::to_string(plan.saved.step) + " from " +
             plan.dir + " (saved by " + std::to_string(plan.reader->metadata().world_size) +
             " rank(s), read on " + std::to_string(mesh.world_size) + ")" +
             (plan.main_params_as_model.empty()
                  ? ""
                  : "; " + std::to_string(plan.main_params_as_model.size()) +
                        " float32 parameters from its fp32 main params (exact)"));
  }
  return plan.saved.step;
}

}  // namespace mixtrain
