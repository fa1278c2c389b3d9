#include "mixtrain/config/toml_front_end.h"

#include <map>
#include <optional>
#include <set>

#include "mixtrain/config/schema.h"
#include "mixtrain/core/logging.h"

namespace mixtrain {
namespace {

// TOML keys that are a plain rename of one canonical key.
const std::vector<std::pair<std::string, std::string>>& renamed_keys() {
  static const std::vector<std::pair<std::string, std::string>> keys = [] {
    std::vector<std::pair<std::string, std::string>> result = {
        {"optimizer.name", "optimizer._target_"},
        {"optimizer.lr", "optimizer.adamw_config.adamw_lr"},
        {"optimizer.eps", "optimizer.adamw_config.adamw_eps"},
        {"optimizer.weight_decay", "optimizer.adamw_config.adamw_weight_decay"},
        {"optimizer.muon_momentum", "optimizer.muon_config.muon_momentum"},
        {"optimizer.muon_enable_nesterov", "optimizer.muon_config.muon_nesterov"},
        {"optimizer.muon_ns_steps", "optimizer.muon_config.muon_ns_steps"},
        {"optimizer.muon_adjust_lr_fn", "optimizer.muon_config.muon_adjust_lr_fn"},
        {"optimizer.muon_communication_dtype", "optimizer.muon_config.muon_communication_dtype"},
        // mixtrain keys in torchtitan-npu's optimizer.muon_* style
        {"optimizer.muon_normuon", "optimizer.muon_config.muon_normuon"},
        {"optimizer.muon_normuon_beta2", "optimizer.muon_config.muon_normuon_beta2"},
        {"optimizer.muon_normuon_epsilon", "optimizer.muon_config.muon_normuon_epsilon"},
        {"optimizer.muon_cautious_weight_decay",
         "optimizer.muon_config.muon_cautious_weight_decay"},
        {"optimizer.muon_per_head", "optimizer.muon_config.muon_per_head"},
        {"optimizer.muon_telemetry", "optimizer.muon_telemetry"},
        {"optimizer.muon_ns_dtype", "optimizer.muon_config.muon_ns_dtype"},
        {"optimizer.muon_qk_clip_tau", "optimizer.muon_config.muon_qk_clip_tau"},
        {"optimizer.swap_optimizer", "optimizer.swap_optimizer"},
        {"optimizer.swap_merge_buckets", "optimizer.swap_merge_buckets"},
        {"optimizer.swap_dir", "optimizer.swap_dir"},  // mixtrain keys, not torchtitan-npu's
        {"optimizer.swap_bucket_mb", "optimizer.swap_bucket_mb"},
        {"training.device", "train.device"},  // a mixtrain key
        {"training.steps", "train.steps"},
        {"training.seed", "train.seed"},
        {"training.max_norm", "train.max_grad_norm"},
        {"training.local_batch_size", "data.micro_batch_size"},
        {"training.seq_len", "data.seq_len"},
        {"training.dataset", "data.kind"},
        {"training.dataset_path", "data.path"},
        {"training.cpu_allocator", "train.cpu_allocator"},
        {"training.mixed_precision_param", "fsdp_config.mix_precision.param_dtype"},
        {"training.mixed_precision_reduce", "fsdp_config.mix_precision.reduce_dtype"},
        {"lr_scheduler.warmup_steps", "train.lr_scheduler.warmup_steps"},
        {"lr_scheduler.decay_type", "train.lr_scheduler.decay"},
        {"lr_scheduler.min_lr_factor", "train.lr_scheduler.min_lr_ratio"},
        {"parallelism.data_parallel_replicate_degree", "parallel.dp_replicate"},
        {"parallelism.data_parallel_shard_degree", "parallel.dp_shard"},
        {"parallelism.expert_parallel_degree", "parallel.ep"},
        {"parallelism.context_parallel_degree", "parallel.cp"},
        {"parallelism.tensor_parallel_degree", "parallel.tp"},
        {"parallelism.context_parallel_rotate_method", "parallel.cp_rotate_method"},
        {"comm.train_timeout_seconds", "distributed.timeout_s"},
        {"checkpoint.interval", "checkpoint.interval"},
        {"checkpoint.keep_latest_k", "checkpoint.keep_last"},
        {"checkpoint.initial_load_path", "checkpoint.restore_from"},
        {"metrics.log_freq", "train.log_every"},
        // torchtitan's [validation] section, with mixtrain's meanings (freq 0 = off, steps 0 =
        // the whole set, in global batches).
        {"validation.freq", "train.eval_every"},
        {"validation.dataset_path", "data.eval_path"},
        {"validation.steps", "data.eval_batches"},
        // torchtitan's switch for its profiler; here it turns on the per-phase step timing.
        {"profiling.enable_profiling", "train.profile"},
    };
    // [model] takes our model keys unchanged.
    for (const LeafSpec& spec : canonical_leaves()) {
      if (spec.key.rfind("model.", 0) == 0) result.emplace_back(spec.key, spec.key);
    }
    return result;
  }();
  return keys;
}

// TOML keys with torchtitan-npu semantics beyond a rename (handled in translate_toml).
const std::vector<std::string>& special_keys() {
  static const std::vector<std::string> keys = {
      "job.dump_folder",
      "job.description",
      "job.custom_config_module",
      "optimizer.muon_lr",
      "optimizer.muon_hybrid_ns",
      "optimizer.muon_ns_variant",
      "optimizer.beta1",
      "optimizer.beta2",
      "training.global_batch_size",
      "checkpoint.enable",
      "checkpoint.folder",
      "checkpoint.async_mode",
      "checkpoint.initial_load_model_only",
  };
  return keys;
}

// torchtitan's defaults where they differ from TrainerConfig's (which the YAML dialect uses).
void apply_dialect_defaults(TrainerConfig& config) {
  config.optimizer.adamw.lr = 8e-4;
  config.optimizer.adamw.weight_decay = 0.1;
  config.mix_precision.param_dtype = "bfloat16";
  config.mix_precision.reduce_dtype = "float32";
  config.checkpoint.interval = 500;
  config.checkpoint.keep_last = 10;
  config.checkpoint.restore_optimizer = false;  // initial_load_model_only = true
}

// The keys found in the document, by "section.key".
class GivenKeys {
 public:
  GivenKeys(const DocValue& document, const std::string& file) : file_(file) {
    std::set<std::string> sections;
    for (const std::string& key : toml_keys()) sections.insert(key.substr(0, key.find('.')));
    for (const auto& [section, table] : document.entries) {
      const std::string origin = table.from_override ? "--set" : file;
      if (sections.count(section) == 0 || !table.is_map()) {
        if (sections.count(section) > 0) {
          throw_config_error({origin, section},
                             "expected a table [" + section + "], got " + table.describe());
        }
        throw_unknown_key(origin, section, table, toml_keys(), toml_key_for);
      }
      for (const auto& [name, value] : table.entries) {
        const std::string key = section + "." + name;
        if (!known(key)) {
          throw_unknown_key(value.from_override ? "--set" : file, key, value, toml_keys(),
                            toml_key_for);
        }
        values_[key] = &value;
      }
    }
  }

  const DocValue* find(const std::string& key) const {
    const auto it = values_.find(key);
    return it == values_.end() ? nullptr : it->second;
  }
  Where where(const std::string& key) const {
    const DocValue* value = find(key);
    return {value != nullptr && value->from_override ? "--set" : file_, key};
  }
  ValueSource source(const std::string& key) const {
    const DocValue* value = find(key);
    return value != nullptr && value->from_override ? ValueSource::kOverride : ValueSource::kFile;
  }

 private:
  static bool known(const std::string& key) {
    for (const std::string& candidate : toml_keys()) {
      if (candidate == key) return true;
    }
    return false;
  }

  std::string file_;
  std::map<std::string, const DocValue*> values_;
};

void record(Provenance& provenance, const std::string& canonical, ValueSource source,
            const std::string& toml_key) {
  provenance.sources[canonical] = source;
  provenance.spelled_as[canonical] = toml_key;
}

void derive(Provenance& provenance, const std::string& canonical, const std::string& note) {
  provenance.sources[canonical] = ValueSource::kDerived;
  provenance.notes[canonical] = note;
}

void translate_optimizer(const GivenKeys& given, TrainerConfig& config, Provenance& provenance) {
  OptimizerConfig& optimizer = config.optimizer;
  MuonConfig& muon = optimizer.muon;
  // torchtitan-npu's flat [optimizer] table has no per-optimizer section for SGD's momentum,
  // dampening and nesterov, so SGD is a YAML-only optimizer (docs/config.md).
  if (optimizer.target == "SGD") {
    throw_config_error(given.where("optimizer.name"),
                       "\"SGD\" is not available in the TOML dialect (its options have no TOML "
                       "keys); use a YAML config with optimizer._target_: SGD and sgd_config");
  }

  const DocValue* beta1 = given.find("optimizer.beta1");
  const DocValue* beta2 = given.find("optimizer.beta2");
  if (beta1 != nullptr)
    optimizer.adamw.betas[0] = read_float(*beta1, given.where("optimizer.beta1"));
  if (beta2 != nullptr)
    optimizer.adamw.betas[1] = read_float(*beta2, given.where("optimizer.beta2"));
  if (beta1 == nullptr && beta2 == nullptr) {
    optimizer.adamw.betas = {0.9, 0.95};
    derive(provenance, "optimizer.adamw_config.adamw_betas", "torchtitan (beta1, beta2) defaults");
  } else {
    if (beta1 == nullptr) optimizer.adamw.betas[0] = 0.9;
    if (beta2 == nullptr) optimizer.adamw.betas[1] = 0.95;
    const std::string key = beta1 != nullptr ? "optimizer.beta1" : "optimizer.beta2";
    record(provenance, "optimizer.adamw_config.adamw_betas", given.source(key),
           "optimizer.beta1, optimizer.beta2");
  }

  muon.ns_epsilon = optimizer.adamw.eps;
  derive(provenance, "optimizer.muon_config.muon_ns_epsilon", "optimizer.eps");
  muon.weight_decay = optimizer.adamw.weight_decay;
  derive(provenance, "optimizer.muon_config.muon_weight_decay", "optimizer.weight_decay");
  muon.momentum_style = "ema_add";
  derive(provenance, "optimizer.muon_config.muon_momentum_style", "torchtitan-npu Muon momentum");
  muon.matched_adamw_rms = 0.18;
  derive(provenance, "optimizer.muon_config.muon_matched_adamw_rms", "torchtitan-npu constant");
  optimizer.routing = "toml";
  derive(provenance, "optimizer.routing", "TOML dialect");

  // muon_ns_variant (a mixtrain key) names any schedule; torchtitan-npu's muon_hybrid_ns only
  // chooses between hybrid and legacy, so giving both is ambiguous and refused.
  const DocValue* variant = given.find("optimizer.muon_ns_variant");
  const DocValue* hybrid_flag = given.find("optimizer.muon_hybrid_ns");
  if (variant != nullptr && hybrid_flag != nullptr) {
    throw_config_error(given.where("optimizer.muon_ns_variant"),
                       "set either optimizer.muon_ns_variant or optimizer.muon_hybrid_ns, not both "
                       "(muon_hybrid_ns = true is muon_ns_variant = \"hybrid\")");
  }
  if (variant != nullptr) {
    muon.ns_variant = read_string(*variant, given.where("optimizer.muon_ns_variant"));
    record(provenance, "optimizer.muon_config.muon_ns_variant",
           given.source("optimizer.muon_ns_variant"), "optimizer.muon_ns_variant");
  } else {
    bool hybrid = false;
    if (hybrid_flag != nullptr) {
      hybrid = read_bool(*hybrid_flag, given.where("optimizer.muon_hybrid_ns"));
    }
    muon.ns_variant = hybrid ? "hybrid" : "legacy";
    derive(provenance, "optimizer.muon_config.muon_ns_variant",
           std::string("optimizer.muon_hybrid_ns = ") + (hybrid ? "true" : "false"));
  }

  std::optional<double> muon_lr;
  if (const DocValue* v = given.find("optimizer.muon_lr")) {
    muon_lr = read_float(*v, given.where("optimizer.muon_lr"));
  }
  const std::string lr_key = "optimizer.muon_config.muon_lr";
  if (muon.adjust_lr_fn == "original") {
    if (muon_lr) {
      muon.lr = *muon_lr;
      record(provenance, lr_key, given.source("optimizer.muon_lr"), "optimizer.muon_lr");
    } else {
      muon.lr = optimizer.adamw.lr;
      derive(provenance, lr_key, "optimizer.lr (muon_lr not set, muon_adjust_lr_fn = original)");
    }
  } else {
    muon.lr = optimizer.adamw.lr;
    std::string note = "optimizer.lr (muon_adjust_lr_fn = " + muon.adjust_lr_fn + ")";
    if (muon_lr) {
      note += "; optimizer.muon_lr = " + format_number(*muon_lr) + " ignored";
      log_warn(given.where("optimizer.muon_lr").origin + ": optimizer.muon_lr = " +
               format_number(*muon_lr) + " is ignored: muon_adjust_lr_fn = \"" + muon.adjust_lr_fn +
               "\" makes Muon use optimizer.lr = " + format_number(optimizer.adamw.lr) +
               " (set muon_adjust_lr_fn = \"original\" to use muon_lr)");
    }
    derive(provenance, lr_key, note);
  }
}

void translate_training_and_checkpoint(const GivenKeys& given, TrainerConfig& config,
                                       Provenance& provenance) {
  // torchtitan: global_batch_size -1 (its default) means local_batch_size x data-parallel size.
  int64_t global_batch = -1;
  if (const DocValue* v = given.find("training.global_batch_size")) {
    global_batch = read_int(*v, given.where("training.global_batch_size"));
  }
  if (global_batch == -1) {
    config.data.global_batch_size =
        config.data.micro_batch_size * config.parallel.dp_replicate * config.parallel.dp_shard;
    derive(provenance, "data.global_batch_size",
           "training.local_batch_size x data_parallel_replicate_degree x "
           "data_parallel_shard_degree");
  } else {
    config.data.global_batch_size = global_batch;
    record(provenance, "data.global_batch_size", given.source("training.global_batch_size"),
           "training.global_batch_size");
  }

  auto string_or = [&](const std::string& key, const std::string& fallback) {
    const DocValue* v = given.find(key);
    return v != nullptr ? read_string(*v, given.where(key)) : fallback;
  };
  for (const char* key : {"job.description", "job.custom_config_module"}) string_or(key, "");
  const std::string dump_folder = string_or("job.dump_folder", "./outputs");
  const std::string folder = string_or("checkpoint.folder", "checkpoint");
  bool enable = false;
  if (const DocValue* v = given.find("checkpoint.enable")) {
    enable = read_bool(*v, given.where("checkpoint.enable"));
  }
  config.checkpoint.dir = !folder.empty() && folder[0] == '/' ? folder : dump_folder + "/" + folder;
  derive(provenance, "checkpoint.dir", "job.dump_folder / checkpoint.folder");
  // A bad interval is still reported by validation, even with checkpoints off.
  if (!enable && config.checkpoint.interval >= 0) {
    config.checkpoint.interval = 0;
    derive(provenance, "checkpoint.interval", "checkpoint.enable = false: no saves");
  }

  if (const DocValue* v = given.find("checkpoint.async_mode")) {
    const Where where = given.where("checkpoint.async_mode");
    const std::string mode = read_string(*v, where);
    if (mode != "disabled" && mode != "async" && mode != "async_with_pinned_mem") {
      throw_config_error(
          where, "must be one of disabled, async, async_with_pinned_mem, got '" + mode + "'");
    }
    config.checkpoint.async = mode != "disabled";
    record(provenance, "checkpoint.async", given.source("checkpoint.async_mode"),
           "checkpoint.async_mode");
  }
  if (const DocValue* v = given.find("checkpoint.initial_load_model_only")) {
    config.checkpoint.restore_optimizer =
        !read_bool(*v, given.where("checkpoint.initial_load_model_only"));
    record(provenance, "checkpoint.restore_optimizer",
           given.source("checkpoint.initial_load_model_only"),
           "checkpoint.initial_load_model_only (negated)");
  }
}

}  // namespace

std::string toml_key_for(const std::string& canonical_key) {
  for (const auto& [toml_key, canonical] : renamed_keys()) {
    if (canonical == canonical_key) return toml_key;
  }
  if (canonical_key == "optimizer.adamw_config.adamw_betas") return "optimizer.beta1";
  if (canonical_key == "optimizer.muon_config.muon_lr") return "optimizer.muon_lr";
  if (canonical_key == "optimizer.muon_config.muon_ns_variant") return "optimizer.muon_ns_variant";
  return "";
}

std::string canonical_key_for(const std::string& toml_key) {
  for (const auto& [key, canonical] : renamed_keys()) {
    if (key == toml_key) return canonical;
  }
  return "";
}

const std::vector<std::string>& toml_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> result;
    for (const auto& entry : renamed_keys()) result.push_back(entry.first);
    for (const std::string& key : special_keys()) result.push_back(key);
    return result;
  }();
  return keys;
}

void translate_toml(const DocValue& document, TrainerConfig& config, Provenance& provenance) {
  const GivenKeys given(document, provenance.file);
  apply_dialect_defaults(config);
  for (const auto& [toml_key, canonical] : renamed_keys()) {
    // Errors about a defaulted leaf still use the name a TOML user knows.
    provenance.spelled_as[canonical] = toml_key;
    const DocValue* value = given.find(toml_key);
    if (value == nullptr) continue;
    find_canonical_leaf(canonical)->assign(config, *value, given.where(toml_key));
    record(provenance, canonical, given.source(toml_key), toml_key);
  }
  translate_optimizer(given, config, provenance);
  translate_training_and_checkpoint(given, config, provenance);

  config.dialect = "toml";
  config.source_file = provenance.file;
  derive(provenance, "dialect", "file extension");
  derive(provenance, "source_file", "");
}

}  // namespace mixtrain
