#include "mixtrain/config/validate.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "mixtrain/config/document.h"
#include "mixtrain/config/load.h"
#include "mixtrain/config/model_sections.h"
#include "mixtrain/config/schema.h"
#include "mixtrain/config/section.h"

namespace mixtrain {
namespace {

class Checker final : public ConfigChecker {
 public:
  Checker(const TrainerConfig& config, const Provenance& provenance)
      : config_(config), provenance_(provenance) {}

  [[noreturn]] void fail(const std::string& key, const std::string& rule) const override {
    throw_config_error({provenance_.origin_of(key), provenance_.user_key(key)}, rule);
  }
  // "got <value>" as the config shows it, so the user sees what was actually resolved.
  [[noreturn]] void fail_value(const std::string& key, const std::string& rule) const override {
    fail(key, rule + ", got " + find_canonical_leaf(key)->format(config_));
  }

  void positive(const std::string& key, double value) const override {
    if (!(value > 0)) fail_value(key, "must be > 0");
  }
  void non_negative(const std::string& key, double value) const override {
    if (!(value >= 0)) fail_value(key, "must be >= 0");
  }
  // Whether the user gave `key` (file, --set, or derived from a key they gave).
  bool derived(const std::string& key) const {
    return provenance_.source(key) == ValueSource::kDerived;
  }
  bool was_set(const std::string& key) const override {
    return provenance_.source(key) != ValueSource::kDefault;
  }
  void unit_interval_open_right(const std::string& key, double value) const {
    if (!(value >= 0 && value < 1)) fail_value(key, "must be in [0, 1)");
  }
  void one_of(const std::string& key, const std::string& value,
              std::initializer_list<const char*> allowed) const {
    one_of(key, value, std::vector<std::string>(allowed.begin(), allowed.end()));
  }
  void one_of(const std::string& key, const std::string& value,
              const std::vector<std::string>& allowed) const {
    std::string list;
    for (const std::string& name : allowed) {
      if (value == name) return;
      list += (list.empty() ? "" : ", ") + name;
    }
    fail(key, "must be one of " + list + ", got '" + value + "'");
  }
  // Another key named inside a rule, spelled as the user's dialect spells it.
  std::string key(const std::string& canonical) const override {
    return provenance_.user_key(canonical);
  }
  void dtype(const std::string& key, const std::string& value) const {
    one_of(key, value, {"float16", "bfloat16", "float32"});
  }

 private:
  const TrainerConfig& config_;
  const Provenance& provenance_;
};

// fp32-main-params §2.5: main_grad is fp32, so the gradient reduction must be too; never rewritten.
// The rule that fp32_main_params breaks, or "" when it holds.
std::string main_params_reduce_problem(bool fp32_main_params, const MixPrecisionConfig& mp,
                                       const std::string& reduce_key) {
  if (!fp32_main_params || mp.reduce_dtype.value_or("") == "float32") return "";
  const std::string got = mp.reduce_dtype ? "it is " + *mp.reduce_dtype : "it is not set";
  return "true requires " + reduce_key + ": float32 (" + got +
         "); set it explicitly, it is never changed automatically";
}

// The keys every model reads, then the model's own section (model_sections.h). The rotary
// keys are the models' own section's (model/registry.cpp, a ConfigSectionSpec check).
void check_model(const Checker& check, const ModelConfig& m) {
  std::vector<std::string> names;
  for (const auto& section : model_sections()) names.push_back(section.name);
  check.one_of("model.name", m.name, names);
  const ModelSection& own = *find_model_section(m.name);
  check.positive("model.vocab_size", m.vocab_size);
  check.positive("model.hidden_size", m.hidden_size);
  check.positive("model.num_layers", m.num_layers);
  check.positive("model.num_heads", m.num_heads);
  check.positive("model.num_kv_heads", m.num_kv_heads);
  check.positive("model.head_dim", m.head_dim);
  check.positive("model.max_seq_len", m.max_seq_len);
  check.positive("model.rope_theta", m.rope_theta);
  check.positive("model.rms_norm_eps", m.rms_norm_eps);
  if (m.num_heads % m.num_kv_heads != 0) {
    check.fail_value("model.num_kv_heads", "must divide " + check.key("model.num_heads") + " (" +
                                               std::to_string(m.num_heads) +
                                               ") for grouped-query attention");
  }
  // Rotary embeddings rotate pairs of dimensions.
  if (m.head_dim % 2 != 0) check.fail_value("model.head_dim", "must be even (rotary embeddings)");
  own.check(m, check);
  // Another model's key, set by the user, would be silently unused: refuse it.
  for (const auto& section : model_sections()) {
    for (const std::string& key : section.own_keys) {
      const auto& mine = own.own_keys;
      if (std::find(mine.begin(), mine.end(), key) != mine.end() || !check.was_set(key)) continue;
      check.fail(key, "is not a key of model " + m.name + " (it belongs to " + section.name +
                          "); remove it or set model.name: " + section.name);
    }
  }
}

void check_data_and_parallel(const Checker& check, const TrainerConfig& c) {
  // Degrees first: the TOML dialect derives the global batch from them.
  check.positive("parallel.dp_shard", c.parallel.dp_shard);
  check.positive("parallel.dp_replicate", c.parallel.dp_replicate);
  check.positive("parallel.ep", c.parallel.ep);
  check.one_of("data.kind", c.data.kind, {"synthetic", "tokens"});
  if (c.data.kind == "tokens" && c.data.path.empty()) {
    check.fail("data.path", "is required when " + check.key("data.kind") +
                                " is tokens (a file or a glob of shards)");
  }
  check.positive("data.seq_len", c.data.seq_len);
  if (c.data.seq_len > c.model.max_seq_len) {
    check.fail_value("data.seq_len", "must be <= " + check.key("model.max_seq_len") + " (" +
                                         std::to_string(c.model.max_seq_len) + ")");
  }
  // SyntheticDataset draws each token's successors from the other vocab_size - 1 tokens.
  if (c.data.kind == "synthetic" && c.model.vocab_size < 2) {
    check.fail_value("model.vocab_size", "must be >= 2 for synthetic data");
  }
  check.positive("data.micro_batch_size", c.data.micro_batch_size);
  check.positive("data.global_batch_size", c.data.global_batch_size);
  check.positive("parallel.cp", c.parallel.cp);
  check.positive("parallel.tp", c.parallel.tp);
  check.one_of("parallel.cp_rotate_method", c.parallel.cp_rotate_method, {"alltoall", "allgather"});
  // Context parallelism cuts each sequence into 2 x cp chunks (rank i holds chunks i and
  // 2cp-1-i: every rank gets the same share of the causal attention work).
  if (c.data.seq_len % (2 * c.parallel.cp) != 0) {
    check.fail_value("data.seq_len", "must be a multiple of 2 x " + check.key("parallel.cp") +
                                         " = " + std::to_string(2 * c.parallel.cp) +
                                         " (each context-parallel rank holds two chunks)");
  }
  // Tensor parallelism splits heads, the vocabulary and the MLP widths evenly.
  if (c.parallel.tp > 1) {
    std::vector<std::pair<std::string, int64_t>> split = {
        {"model.num_heads", c.model.num_heads},
        {"model.num_kv_heads", c.model.num_kv_heads},
        {"model.vocab_size", c.model.vocab_size}};
    for (const auto& extra : find_model_section(c.model.name)->tp_split_sizes(c.model)) {
      split.push_back(extra);
    }
    for (const auto& [key, size] : split) {
      if (size % c.parallel.tp != 0) {
        check.fail_value("parallel.tp", "must divide " + check.key(key) + " (" +
                                            std::to_string(size) +
                                            "): tensor parallelism splits it evenly");
      }
    }
  }
  const int64_t dp_size = c.parallel.dp_shard * c.parallel.dp_replicate;
  const int64_t per_step = c.data.micro_batch_size * dp_size;
  if (c.data.global_batch_size % per_step != 0) {
    check.fail_value("data.global_batch_size",
                     "must be a multiple of " + check.key("data.micro_batch_size") + " x " +
                         check.key("parallel.dp_replicate") + " x " +
                         check.key("parallel.dp_shard") + " = " + std::to_string(per_step) +
                         " (global = micro x accumulation x dp)");
  }
  const int64_t experts = find_model_section(c.model.name)->routed_experts(c.model);
  if (experts == 0 && c.parallel.ep != 1) {
    check.fail_value("parallel.ep",
                     "must be 1 for model " + c.model.name + " (it has no routed experts)");
  }
  if (experts > 0 && experts % c.parallel.ep != 0) {
    check.fail_value("parallel.ep", "must divide " + check.key("model.num_experts") + " (" +
                                        std::to_string(experts) + ")");
  }
  // Expert-parallel groups are blocks of ep ranks inside one dp_shard row (DeviceMesh).
  if (c.parallel.dp_shard % c.parallel.ep != 0) {
    check.fail_value("parallel.ep", "must divide " + check.key("parallel.dp_shard") + " (" +
                                        std::to_string(c.parallel.dp_shard) + ")");
  }
  check.positive("distributed.timeout_s", c.distributed.timeout_s);
}

void check_train_and_checkpoint(const Checker& check, const TrainerConfig& c) {
  check.one_of("train.device", c.train.device, {"cpu", "cuda"});
  check.positive("train.steps", c.train.steps);
  check.non_negative("train.seed", c.train.seed);
  check.positive("train.log_every", c.train.log_every);
  check.non_negative("train.eval_every", c.train.eval_every);
  check.non_negative("data.eval_batches", c.data.eval_batches);
  if (c.train.eval_every > 0 && c.data.eval_path.empty()) {
    check.fail("data.eval_path", "is required when " + check.key("train.eval_every") +
                                     " is > 0 (a file, a glob, or a directory of val_*.bin)");
  }
  check.non_negative("train.lr_scheduler.warmup_steps", c.train.lr_scheduler.warmup_steps);
  check.one_of("train.lr_scheduler.decay", c.train.lr_scheduler.decay,
               {"constant", "linear", "cosine"});
  check.one_of("train.cpu_allocator", c.train.cpu_allocator, {"caching", "system"});
  check.one_of("train.activation_checkpointing", c.train.activation_checkpointing,
               {"none", "full", "selective"});
  check.positive("train.activation_checkpointing_every",
                 static_cast<double>(c.train.activation_checkpointing_every));
  if (c.train.activation_checkpointing != "selective" &&
      check.was_set("train.activation_checkpointing_every")) {
    check.fail("train.activation_checkpointing_every",
               "applies only with " + check.key("train.activation_checkpointing") +
                   ": selective (it is " + c.train.activation_checkpointing +
                   "); remove it or select layers");
  }
  const double min_ratio = c.train.lr_scheduler.min_lr_ratio;
  if (!(min_ratio >= 0 && min_ratio <= 1)) {
    check.fail_value("train.lr_scheduler.min_lr_ratio", "must be in [0, 1]");
  }
  check.non_negative("checkpoint.interval", c.checkpoint.interval);
  check.non_negative("checkpoint.keep_last", c.checkpoint.keep_last);
}

// The generic keys, then every registered section: each leaf's own rule (those the user set
// or left at the default first, then those derived from other keys, so a bad value is named by
// the key the user wrote), then the sections' rules across keys.
void check_optimizer(const Checker& check, const TrainerConfig& c) {
  const OptimizerConfig& o = c.optimizer;
  check.one_of("optimizer._target_", o.target, section_targets(o.routing == "toml"));
  for (const bool derived : {false, true}) {
    for (const ConfigSectionSpec& section : config_sections()) {
      for (const LeafSpec& leaf : section.leaves) {
        if (!leaf.problem || check.derived(leaf.key) != derived) continue;
        const std::string problem = leaf.problem(c);
        if (!problem.empty()) check.fail(leaf.key, problem);
      }
    }
  }
  for (const ConfigSectionSpec& section : config_sections()) {
    if (section.check) section.check(c, check);
  }
  check.one_of("optimizer.routing", o.routing, {"yaml", "toml"});
  check.positive("optimizer.swap_merge_buckets", o.swap_merge_buckets);
  check.positive("optimizer.swap_bucket_mb", o.swap_bucket_mb);
  if (o.swap_bucket_mb > (int64_t{1} << 20)) {  // 1 TiB; bytes must fit in int64 with room
    check.fail_value("optimizer.swap_bucket_mb", "must be <= 1048576 (1 TiB)");
  }
}

void check_precision(const Checker& check, const TrainerConfig& c) {
  if (c.model_init_dtype) check.dtype("model_init_dtype", *c.model_init_dtype);
  check.dtype("fsdp_config.mix_precision.param_dtype", c.mix_precision.param_dtype);
  check.dtype("fsdp_config.mix_precision.output_dtype", c.mix_precision.output_dtype);
  if (c.mix_precision.reduce_dtype) {
    check.dtype("fsdp_config.mix_precision.reduce_dtype", *c.mix_precision.reduce_dtype);
  }
  const std::string problem =
      main_params_reduce_problem(c.optimizer.fp32_main_params, c.mix_precision,
                                 check.key("fsdp_config.mix_precision.reduce_dtype"));
  if (!problem.empty()) check.fail("optimizer.fp32_main_params", problem);
}

}  // namespace

void validate_config(const TrainerConfig& config, const Provenance& provenance) {
  const Checker check(config, provenance);
  check_precision(check, config);
  check_model(check, config.model);
  check_data_and_parallel(check, config);
  check_train_and_checkpoint(check, config);
  check_optimizer(check, config);
}

void validate_config(const TrainerConfig& config) {
  Provenance provenance;
  provenance.file =
      config.source_file.empty() ? "TrainerConfig (built in code)" : config.source_file;
  validate_config(config, provenance);
}

void validate_config(const ResolvedConfig& resolved) {
  if (resolved.provenance.file.empty()) {
    validate_config(resolved.config);
  } else {
    validate_config(resolved.config, resolved.provenance);
  }
}

std::vector<std::string> config_warnings(const TrainerConfig& config) {
  std::vector<std::string> warnings;
  for (const ConfigSectionSpec& section : config_sections()) {
    if (!section.warnings) continue;
    for (std::string& warning : section.warnings(config)) warnings.push_back(std::move(warning));
  }
  return warnings;
}

}  // namespace mixtrain
