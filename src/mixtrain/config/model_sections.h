// The config side of the model seam: for each model name, the model.* keys of its own section,
// their checks, how many routed experts it has, what tensor parallelism splits and its
// capabilities. Each model family registers its section (model/registry.h
// register_model_sections, with its factory); config/ names no model.
//
// Keys every model reads (name, vocab_size, hidden_size, num_layers, num_heads, num_kv_heads,
// head_dim, max_seq_len, rope_theta, rms_norm_eps, the rope scaling keys) are checked by
// validate.cpp and the model section (model/registry.cpp) for all. A model-specific key (one
// listed by any section) that the chosen model does not read is refused when the user set it
// (file or --set): "model.num_experts: is not a key of model <name> (...)". Left at its default
// it is ignored.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/config/section.h"
#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

// What a section's check may do (section.h).
using ModelKeyChecker = ConfigChecker;

struct ModelSection {
  std::string name;                   // model.name
  std::vector<std::string> own_keys;  // canonical model-specific keys this model reads
  std::function<void(const ModelConfig&, const ModelKeyChecker&)> check;
  // Routed experts (parallel.ep must divide it); 0 for a dense model (parallel.ep must be 1).
  std::function<int64_t(const ModelConfig&)> routed_experts;
  // Tensor parallelism: this model's own keys whose sizes are split over parallel.tp (beyond
  // the common num_heads, num_kv_heads, vocab_size), each with its value; tp must divide each.
  std::function<std::vector<std::pair<std::string, int64_t>>(const ModelConfig&)> tp_split_sizes;
  // Per-head RMSNorm on queries and keys: the attention logits do not depend on the q/k
  // projections' scale.
  bool qk_norm = false;
};

// Registers a model's section; throws std::logic_error for a second one of the same name. The
// first registered with `is_default` names the model a config gets without model.name.
void register_model_section(ModelSection section, bool is_default = false);

// In registration order.
const std::vector<ModelSection>& model_sections();

// The section of `name`, or nullptr.
const ModelSection* find_model_section(const std::string& name);

// Whether model `model_name` reads canonical key `key`: every key outside the model sections,
// and its own section's keys (false for another model's keys).
bool model_reads_key(const std::string& model_name, const std::string& key);

}  // namespace mixtrain
