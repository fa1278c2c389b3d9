// Hugging Face config.json <-> ModelConfig (docs/config.md, "Hugging Face models").
//
// read_hf_config maps the config.json of a registered model_type (model/registry.h; each its
// HfFamily) (what transformers' save_pretrained writes, 4.x and 5.x spellings) onto the model.*
// keys. Every field the mapping reads is checked (type and range), and every field that would
// change the model into one we do not build is refused unless it has the one value we support:
// rope_type other than default or llama3, hidden_act other than
// silu, mlp_bias true, pretraining_tp != 1, attention_dropout != 0, use_sliding_window true or a
// layer_types entry other than full_attention, decoder_sparse_step != 1, a non-empty
// mlp_only_layers, a quantization_config. Fields that do not change the model (token ids,
// dtype, initializer_range, use_cache, ...) are ignored. tie_word_embeddings maps onto
// model.tie_word_embeddings (absent: false, every supported family's default). Each problem is one
// ConfigError
// "<path>: <field>: <problem>".
//
// apply_hf_config runs in load_config between the front end and validation: with model.hf_config
// set (or implied: model.init_from DIR sets it to DIR/config.json) it writes the keys of
// hf_config_fields into the TrainerConfig and records them as derived from the file. An
// architecture key also set by the user must have the file's value (a different one is refused,
// naming both); max_seq_len and router_aux_loss_coef are training choices, so a value the user
// set wins over the file's.
//
// hf_config_json is the reverse, for export: a config.json transformers loads as the same
// model (model_type, architectures, every field read_hf_config reads, with the supported
// values of the refused ones).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/config/provenance.h"
#include "mixtrain/config/trainer_config.h"

namespace mixtrain {

// Field reads of one config.json, for read_hf_config and a family's own fields (hf_family.h
// read_own); every failure is a ConfigError "<path>: <field>: <problem>".
class HfConfigReader {
 public:
  HfConfigReader(std::string path, const nlohmann::json& root);

  [[noreturn]] void fail(const std::string& field, const std::string& problem) const;
  // Absent and null read alike: HF writes null for "use the default".
  const nlohmann::json* find(const std::string& field) const;
  const nlohmann::json& require(const std::string& field) const;  // "missing" if absent
  int64_t positive_int(const std::string& field, const nlohmann::json& value) const;
  int64_t positive_int(const std::string& field) const;                        // required
  double number(const std::string& field, const nlohmann::json& value) const;  // finite
  bool boolean(const std::string& field, bool absent) const;
  // A field whose only supported value is `supported` (absent is the supported default).
  void only(const std::string& field, const nlohmann::json& supported,
            const std::string& why) const;

 private:
  std::string path_;
  const nlohmann::json& root_;
};

// One model.* key filled from config.json.
struct HfField {
  std::string key;       // canonical key, "model.num_layers"
  std::string hf_field;  // where it came from, "num_hidden_layers" (or "default: ..." )
  bool architecture;     // true: a value the user sets too must agree
};

struct HfModelConfig {
  ModelConfig model;  // the architecture fields, max_seq_len and router_aux_loss_coef set
  std::vector<HfField> fields;
};

HfModelConfig read_hf_config(const std::string& path);

// The config.json path a config implies: model.hf_config, else <model.init_from>/config.json,
// else "".
std::string implied_hf_config_path(const ModelConfig& model);

void apply_hf_config(TrainerConfig& config, Provenance& provenance);

// `dtype`: the "dtype" field written ("bfloat16", "float32"), what the weights are stored in.
nlohmann::json hf_config_json(const ModelConfig& model, const std::string& dtype);

}  // namespace mixtrain
