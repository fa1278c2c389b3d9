#include "mixtrain/config/toml_front_end.h"

#include <cstdlib>
#include <map>
#include <set>

#include "mixtrain/config/schema.h"
#include "mixtrain/config/section.h"
#include "mixtrain/core/logging.h"

namespace mixtrain {
namespace {

// TOML keys that are a plain rename of one canonical key.
const std::vector<std::pair<std::string, std::string>>& renamed_keys() {
  static const std::vector<std::pair<std::string, std::string>> keys = [] {
    std::vector<std::pair<std::string, std::string>> result = {
        {"optimizer.name", "optimizer._target_"},
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
        // torchtitan's [activation_checkpoint]: mode none | full | selective (its
        // selective_ac_option, the layer count, is translated below).
        {"activation_checkpoint.mode", "train.activation_checkpointing"},
    };
    // [model] takes our model keys unchanged.
    for (const LeafSpec& spec : canonical_leaves()) {
      if (spec.key.rfind("model.", 0) == 0) result.emplace_back(spec.key, spec.key);
    }
    // The sections' plain renames.
    for (const ConfigSectionSpec& section : config_sections()) {
      for (const LeafSpec& leaf : section.leaves) {
        if (!leaf.toml_key.empty() && !leaf.toml_by_section) {
          result.emplace_back(leaf.toml_key, leaf.key);
        }
      }
    }
    return result;
  }();
  return keys;
}

// TOML keys with torchtitan-npu semantics beyond a rename (handled in translate_toml and by
// the sections' translate_toml).
const std::vector<std::string>& special_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> result = {
        "job.dump_folder",
        "job.description",
        "job.custom_config_module",
        "training.global_batch_size",
        "checkpoint.enable",
        "checkpoint.folder",
        "checkpoint.async_mode",
        "checkpoint.initial_load_model_only",
        "activation_checkpoint.selective_ac_option",
    };
    for (const ConfigSectionSpec& section : config_sections()) {
      result.insert(result.end(), section.toml_keys.begin(), section.toml_keys.end());
    }
    return result;
  }();
  return keys;
}

// torchtitan's defaults where they differ from TrainerConfig's (which the YAML dialect uses).
void apply_dialect_defaults(TrainerConfig& config) {
  for (const ConfigSectionSpec& section : config_sections()) {
    if (section.toml_defaults) section.toml_defaults(config);
  }
  config.mix_precision.param_dtype = "bfloat16";
  config.mix_precision.reduce_dtype = "float32";
  config.checkpoint.interval = 500;
  config.checkpoint.keep_last = 10;
  config.checkpoint.restore_optimizer = false;  // initial_load_model_only = true
}

// The keys found in the document, by "section.key".
class GivenKeys final : public TomlInput {
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

  const DocValue* find(const std::string& key) const override {
    const auto it = values_.find(key);
    return it == values_.end() ? nullptr : it->second;
  }
  Where where(const std::string& key) const override {
    const DocValue* value = find(key);
    return {value != nullptr && value->from_override ? "--set" : file_, key};
  }
  ValueSource source(const std::string& key) const override {
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
  record_toml(provenance, canonical, source, toml_key);
}

void derive(Provenance& provenance, const std::string& canonical, const std::string& note) {
  record_derived(provenance, canonical, note);
}

// The optimizer sections' own translations (an optimizer without TOML keys refuses itself
// there), and the routing rule of the dialect.
void translate_optimizer(const GivenKeys& given, TrainerConfig& config, Provenance& provenance) {
  for (const ConfigSectionSpec& section : config_sections()) {
    if (section.translate_toml) section.translate_toml(given, config, provenance);
  }
  config.optimizer.routing = "toml";
  derive(provenance, "optimizer.routing", "TOML dialect");
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
  // torchtitan's selective_ac_option: a layer count ("2": every 2nd block), or "op" (per-op
  // selection by a save list, which mixtrain does not have).
  if (const DocValue* v = given.find("activation_checkpoint.selective_ac_option")) {
    const Where where = given.where("activation_checkpoint.selective_ac_option");
    const std::string option = read_string(*v, where);
    char* end = nullptr;
    const long long every = std::strtoll(option.c_str(), &end, 10);
    if (option.empty() || *end != '\0' || every < 1) {
      throw_config_error(where,
                         "must be a layer count >= 1 such as '2' (op-level selection, "
                         "'op', is not supported), got '" +
                             option + "'");
    }
    config.train.activation_checkpointing_every = every;
    record(provenance, "train.activation_checkpointing_every",
           given.source("activation_checkpoint.selective_ac_option"),
           "activation_checkpoint.selective_ac_option");
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
  for (const ConfigSectionSpec& section : config_sections()) {
    for (const LeafSpec& leaf : section.leaves) {
      if (leaf.key == canonical_key && leaf.toml_by_section) return leaf.toml_key;
    }
  }
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
