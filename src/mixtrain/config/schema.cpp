#include "mixtrain/config/schema.h"

#include "mixtrain/config/leaf.h"
#include "mixtrain/core/text.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>

namespace mixtrain {

void freeze_config_sections();  // section.cpp

namespace {
// Where the registered sections' leaves go (ConfigSectionSpec::slot): after this key.
const std::map<std::string, std::string>& slot_after_keys() {
  static const std::map<std::string, std::string> slots = {
      {"model.attention_bias", "model"}, {"optimizer.fp32_main_params", "optimizer"}};
  return slots;
}
}  // namespace

std::string format_number(double value) {
  char buffer[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  // Like Python's repr: plain digits below 1e16 (10000, not 1e+04).
  const double magnitude = std::fabs(value);
  if (magnitude >= 1 && magnitude < 1e16) {
    const int digits = static_cast<int>(std::floor(std::log10(magnitude))) + 1;
    if (digits > precision) std::snprintf(buffer, sizeof(buffer), "%.*g", digits, value);
  }
  return buffer;
}

std::string format_pair(const std::array<double, 2>& pair) {
  return "[" + format_number(pair[0]) + ", " + format_number(pair[1]) + "]";
}

std::string format_triples(const std::vector<std::array<double, 3>>& triples) {
  std::string text = "[";
  for (size_t i = 0; i < triples.size(); ++i) {
    if (i > 0) text += ", ";
    text += "[" + format_number(triples[i][0]) + ", " + format_number(triples[i][1]) + ", " +
            format_number(triples[i][2]) + "]";
  }
  return text + "]";
}

std::string format_string_list(const std::vector<std::string>& strings) {
  return format_list(strings);
}

namespace {

#define MIXTRAIN_LEAF(key, field) \
  field_leaf(                     \
      key, [](auto& c) -> auto& { return c.field; })
#define MIXTRAIN_DERIVED_LEAF(key, field) \
  field_leaf(                             \
      key, [](auto& c) -> auto& { return c.field; }, false)

std::vector<LeafSpec> build_leaves() {
  return {
      MIXTRAIN_DERIVED_LEAF("dialect", dialect),
      MIXTRAIN_DERIVED_LEAF("source_file", source_file),
      MIXTRAIN_LEAF("model_init_dtype", model_init_dtype),
      MIXTRAIN_LEAF("model.name", model.name),
      MIXTRAIN_LEAF("model.hf_config", model.hf_config),
      MIXTRAIN_LEAF("model.init_from", model.init_from),
      MIXTRAIN_LEAF("model.vocab_size", model.vocab_size),
      MIXTRAIN_LEAF("model.hidden_size", model.hidden_size),
      MIXTRAIN_LEAF("model.num_layers", model.num_layers),
      MIXTRAIN_LEAF("model.num_heads", model.num_heads),
      MIXTRAIN_LEAF("model.num_kv_heads", model.num_kv_heads),
      MIXTRAIN_LEAF("model.head_dim", model.head_dim),
      MIXTRAIN_LEAF("model.intermediate_size", model.intermediate_size),
      MIXTRAIN_LEAF("model.max_seq_len", model.max_seq_len),
      MIXTRAIN_LEAF("model.rope_theta", model.rope_theta),
      MIXTRAIN_LEAF("model.rope_scaling", model.rope_scaling),
      MIXTRAIN_LEAF("model.rope_scaling_factor", model.rope_scaling_factor),
      MIXTRAIN_LEAF("model.rope_low_freq_factor", model.rope_low_freq_factor),
      MIXTRAIN_LEAF("model.rope_high_freq_factor", model.rope_high_freq_factor),
      MIXTRAIN_LEAF("model.rope_original_max_seq_len", model.rope_original_max_seq_len),
      MIXTRAIN_LEAF("model.rope_yarn_beta_fast", model.rope_yarn_beta_fast),
      MIXTRAIN_LEAF("model.rope_yarn_beta_slow", model.rope_yarn_beta_slow),
      MIXTRAIN_LEAF("model.rope_yarn_mscale", model.rope_yarn_mscale),
      MIXTRAIN_LEAF("model.rope_yarn_mscale_all_dim", model.rope_yarn_mscale_all_dim),
      MIXTRAIN_LEAF("model.rms_norm_eps", model.rms_norm_eps),
      MIXTRAIN_LEAF("model.tie_word_embeddings", model.tie_word_embeddings),
      MIXTRAIN_LEAF("model.attention_bias", model.attention_bias),
      MIXTRAIN_LEAF("data.kind", data.kind),
      MIXTRAIN_LEAF("data.path", data.path),
      MIXTRAIN_LEAF("data.seq_len", data.seq_len),
      MIXTRAIN_LEAF("data.micro_batch_size", data.micro_batch_size),
      MIXTRAIN_LEAF("data.global_batch_size", data.global_batch_size),
      MIXTRAIN_LEAF("data.eval_path", data.eval_path),
      MIXTRAIN_LEAF("data.eval_batches", data.eval_batches),
      MIXTRAIN_LEAF("train.device", train.device),
      MIXTRAIN_LEAF("train.steps", train.steps),
      MIXTRAIN_LEAF("train.seed", train.seed),
      MIXTRAIN_LEAF("train.max_grad_norm", train.max_grad_norm),
      MIXTRAIN_LEAF("train.log_every", train.log_every),
      MIXTRAIN_LEAF("train.eval_every", train.eval_every),
      MIXTRAIN_LEAF("train.profile", train.profile),
      MIXTRAIN_LEAF("train.count_ops", train.count_ops),
      MIXTRAIN_LEAF("train.cpu_allocator", train.cpu_allocator),
      MIXTRAIN_LEAF("train.activation_checkpointing", train.activation_checkpointing),
      MIXTRAIN_LEAF("train.activation_checkpointing_every", train.activation_checkpointing_every),
      MIXTRAIN_LEAF("train.lr_scheduler.warmup_steps", train.lr_scheduler.warmup_steps),
      MIXTRAIN_LEAF("train.lr_scheduler.decay", train.lr_scheduler.decay),
      MIXTRAIN_LEAF("train.lr_scheduler.min_lr_ratio", train.lr_scheduler.min_lr_ratio),
      MIXTRAIN_LEAF("parallel.dp_shard", parallel.dp_shard),
      MIXTRAIN_LEAF("parallel.dp_replicate", parallel.dp_replicate),
      MIXTRAIN_LEAF("parallel.ep", parallel.ep),
      MIXTRAIN_LEAF("parallel.cp", parallel.cp),
      MIXTRAIN_LEAF("parallel.tp", parallel.tp),
      MIXTRAIN_LEAF("parallel.cp_rotate_method", parallel.cp_rotate_method),
      MIXTRAIN_LEAF("distributed.timeout_s", distributed.timeout_s),
      MIXTRAIN_LEAF("checkpoint.dir", checkpoint.dir),
      MIXTRAIN_LEAF("checkpoint.interval", checkpoint.interval),
      MIXTRAIN_LEAF("checkpoint.keep_last", checkpoint.keep_last),
      MIXTRAIN_LEAF("checkpoint.async", checkpoint.async),
      MIXTRAIN_LEAF("checkpoint.save_optimizer", checkpoint.save_optimizer),
      MIXTRAIN_LEAF("checkpoint.restore_from", checkpoint.restore_from),
      MIXTRAIN_LEAF("checkpoint.restore_optimizer", checkpoint.restore_optimizer),
      MIXTRAIN_LEAF("optimizer._target_", optimizer.target),
      MIXTRAIN_LEAF("optimizer.fp32_main_params", optimizer.fp32_main_params),
      MIXTRAIN_DERIVED_LEAF("optimizer.routing", optimizer.routing),
      MIXTRAIN_LEAF("optimizer.swap_optimizer", optimizer.swap_optimizer),
      MIXTRAIN_LEAF("optimizer.swap_merge_buckets", optimizer.swap_merge_buckets),
      MIXTRAIN_LEAF("optimizer.swap_dir", optimizer.swap_dir),
      MIXTRAIN_LEAF("optimizer.swap_bucket_mb", optimizer.swap_bucket_mb),
      MIXTRAIN_LEAF("fsdp_config.mix_precision.param_dtype", mix_precision.param_dtype),
      MIXTRAIN_LEAF("fsdp_config.mix_precision.reduce_dtype", mix_precision.reduce_dtype),
      MIXTRAIN_LEAF("fsdp_config.mix_precision.output_dtype", mix_precision.output_dtype),
      MIXTRAIN_LEAF("fsdp_config.mix_precision.cast_forward_inputs",
                    mix_precision.cast_forward_inputs),
      MIXTRAIN_LEAF("fsdp_config.reshard_after_forward", fsdp.reshard_after_forward),
  };
}

#undef MIXTRAIN_LEAF
#undef MIXTRAIN_DERIVED_LEAF

}  // namespace

const std::vector<LeafSpec>& canonical_leaves() {
  static const std::vector<LeafSpec> leaves = [] {
    freeze_config_sections();
    std::vector<LeafSpec> own = build_leaves();
    for (const ConfigSectionSpec& section : config_sections()) {
      if (section.slot.empty() && section.leaves.empty()) continue;
      bool known = false;
      for (const auto& [after, slot] : slot_after_keys()) known |= slot == section.slot;
      if (!known) {
        throw std::logic_error("config section '" + section.name + "': unknown slot '" +
                               section.slot + "'");
      }
    }
    std::vector<LeafSpec> all;
    for (LeafSpec& leaf : own) {
      const auto slot = slot_after_keys().find(leaf.key);
      all.push_back(std::move(leaf));
      if (slot == slot_after_keys().end()) continue;
      for (const ConfigSectionSpec& section : config_sections()) {
        if (section.slot != slot->second) continue;
        all.insert(all.end(), section.leaves.begin(), section.leaves.end());
      }
    }
    return all;
  }();
  return leaves;
}

const LeafSpec* find_canonical_leaf(const std::string& key) {
  static const std::unordered_map<std::string, const LeafSpec*> index = [] {
    std::unordered_map<std::string, const LeafSpec*> map;
    for (const LeafSpec& spec : canonical_leaves()) map[spec.key] = &spec;
    return map;
  }();
  const auto it = index.find(key);
  return it == index.end() ? nullptr : it->second;
}

}  // namespace mixtrain
