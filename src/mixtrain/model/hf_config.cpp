#include "mixtrain/model/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "mixtrain/config/model_sections.h"
#include "mixtrain/config/schema.h"
#include "mixtrain/config/yaml_reader.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/printable.h"
#include "mixtrain/model/moe_config.h"
#include "mixtrain/model/registry.h"
#include "mixtrain/model/sliding_window_config.h"

namespace mixtrain {
namespace {

using json = nlohmann::json;

}  // namespace

HfConfigReader::HfConfigReader(std::string path, const json& root)
    : path_(std::move(path)), root_(root) {}

void HfConfigReader::fail(const std::string& field, const std::string& problem) const {
  throw ConfigError(path_ + ": " + field + ": " + problem);
}

const json* HfConfigReader::find(const std::string& field) const {
  const auto it = root_.find(field);
  return it == root_.end() || it->is_null() ? nullptr : &*it;
}

const json& HfConfigReader::require(const std::string& field) const {
  const json* value = find(field);
  if (value == nullptr) fail(field, "missing (mixtrain reads it; transformers writes it)");
  return *value;
}

int64_t HfConfigReader::positive_int(const std::string& field, const json& value) const {
  if (!value.is_number_integer() || value.get<int64_t>() <= 0) {
    fail(field, "must be an integer > 0, got " + printable(value.dump()));
  }
  return value.get<int64_t>();
}

int64_t HfConfigReader::positive_int(const std::string& field) const {
  return positive_int(field, require(field));
}

double HfConfigReader::number(const std::string& field, const json& value) const {
  if (!value.is_number() || !std::isfinite(value.get<double>())) {
    fail(field, "must be a finite number, got " + printable(value.dump()));
  }
  return value.get<double>();
}

bool HfConfigReader::boolean(const std::string& field, bool absent) const {
  const json* value = find(field);
  if (value == nullptr) return absent;
  if (!value->is_boolean()) fail(field, "must be true or false, got " + printable(value->dump()));
  return value->get<bool>();
}

void HfConfigReader::only(const std::string& field, const json& supported,
                          const std::string& why) const {
  const json* value = find(field);
  if (value != nullptr && *value != supported) {
    fail(field, printable(value->dump()) + " is not supported (mixtrain supports " +
                    supported.dump() + ": " + why + ")");
  }
}

namespace {

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot read the Hugging Face config.json");
  std::stringstream text;
  text << in.rdbuf();
  json root;
  try {
    root = json::parse(text.str());
  } catch (const json::parse_error& error) {
    throw ConfigError(path + ": not valid JSON: " + printable(error.what()));
  }
  if (!root.is_object()) throw ConfigError(path + ": must be a JSON object");
  return root;
}

// Rotary embeddings, from either spelling: transformers 5's rope_parameters {rope_type,
// rope_theta, ...}, or 4.x's top-level rope_theta and rope_scaling {type or rope_type, ...}
// (null = default; transformers 5.24 still reads it). rope_type default or llama3; llama3's
// factor, low_freq_factor and high_freq_factor are required, original_max_position_embeddings
// comes, as transformers' standardize_rope_params takes it, from the top level first, then the
// rope dict, then max_position_embeddings. Fills m.rope_* (m.max_seq_len already read).
void read_rope(const HfConfigReader& r, ModelConfig& m,
               const std::function<void(const std::string&, const std::string&)>& add) {
  m.rope_theta = 10000.0;  // every family's class default
  std::string theta_field = "default: 10000";
  if (const json* top = r.find("rope_theta")) {
    m.rope_theta = r.number("rope_theta", *top);
    theta_field = "rope_theta";
  }
  std::string type = "default", type_field = "default: no rope_type";
  std::map<std::string, std::pair<std::string, json>> params;  // llama3's: name -> (field, value)
  for (const char* name : {"rope_parameters", "rope_scaling"}) {
    const json* rope = r.find(name);
    if (rope == nullptr) continue;
    if (!rope->is_object()) r.fail(name, "must be an object, got " + printable(rope->dump()));
    for (const auto& [key, value] : rope->items()) {
      const std::string at = std::string(name) + "." + key;
      if (key == "rope_type" || (key == "type" && !rope->contains("rope_type"))) {
        if (value != "default" && value != "llama3" && value != "yarn") {
          r.fail(at, printable(value.dump()) +
                         " is not supported (mixtrain's rotary embeddings are default, llama3 "
                         "or yarn)");
        }
        type = value.get<std::string>();
        type_field = at;
      } else if (key == "rope_theta") {
        m.rope_theta = r.number(at, value);
        theta_field = at;
      } else if (key == "factor" || key == "low_freq_factor" || key == "high_freq_factor" ||
                 key == "original_max_position_embeddings" || key == "beta_fast" ||
                 key == "beta_slow" || key == "mscale" || key == "mscale_all_dim") {
        params[key] = {at, value};
      } else if (key == "truncate") {
        if (value != true) r.fail(at, "only true is supported (YaRN's truncated correction range)");
      } else if (key != "type") {
        r.fail(at,
               "is not supported (mixtrain's rotary embeddings take rope_type, rope_theta, "
               "llama3's factor, low_freq_factor, high_freq_factor, "
               "original_max_position_embeddings, and yarn's factor, beta_fast, beta_slow, "
               "mscale, mscale_all_dim, original_max_position_embeddings)");
      }
    }
  }
  if (!(m.rope_theta > 0)) r.fail(theta_field, "must be > 0");
  add("model.rope_theta", theta_field);
  m.rope_scaling = type == "default" ? "none" : type;
  add("model.rope_scaling", type_field);
  if (type == "default") {
    if (!params.empty()) {
      const auto& [key, entry] = *params.begin();
      r.fail(entry.first, "is not a parameter of rope_type default (only llama3 and yarn have it)");
    }
    return;
  }
  // Each parameter belongs to one scheme (factor and original_max_position_embeddings to both).
  for (const auto& [key, entry] : params) {
    const bool llama3_only = key == "low_freq_factor" || key == "high_freq_factor";
    const bool yarn_only =
        key == "beta_fast" || key == "beta_slow" || key == "mscale" || key == "mscale_all_dim";
    if ((llama3_only && type != "llama3") || (yarn_only && type != "yarn")) {
      r.fail(entry.first, "is not a parameter of rope_type " + type);
    }
  }
  const auto factor = [&](const std::string& key, double& into, const std::string& canonical) {
    const auto it = params.find(key);
    if (it == params.end()) r.fail(type_field, type + " needs " + key + " (missing)");
    into = r.number(it->second.first, it->second.second);
    add(canonical, it->second.first);
  };
  factor("factor", m.rope_scaling_factor, "model.rope_scaling_factor");
  if (type == "llama3") {
    factor("low_freq_factor", m.rope_low_freq_factor, "model.rope_low_freq_factor");
    factor("high_freq_factor", m.rope_high_freq_factor, "model.rope_high_freq_factor");
  } else {  // yarn: each optional, HF's defaults (beta 32 and 1; mscales absent)
    const auto optional = [&](const std::string& key, double& into, double absent,
                              const std::string& canonical) {
      const auto it = params.find(key);
      into = it == params.end() ? absent : r.number(it->second.first, it->second.second);
      std::ostringstream text;
      text << "default: " << absent;
      add(canonical, it == params.end() ? text.str() : it->second.first);
    };
    optional("beta_fast", m.rope_yarn_beta_fast, 32.0, "model.rope_yarn_beta_fast");
    optional("beta_slow", m.rope_yarn_beta_slow, 1.0, "model.rope_yarn_beta_slow");
    optional("mscale", m.rope_yarn_mscale, 0.0, "model.rope_yarn_mscale");
    optional("mscale_all_dim", m.rope_yarn_mscale_all_dim, 0.0, "model.rope_yarn_mscale_all_dim");
  }
  const auto original = params.find("original_max_position_embeddings");
  if (const json* top = r.find("original_max_position_embeddings")) {
    m.rope_original_max_seq_len = r.positive_int("original_max_position_embeddings", *top);
    add("model.rope_original_max_seq_len", "original_max_position_embeddings");
  } else if (original != params.end()) {
    m.rope_original_max_seq_len = r.positive_int(original->second.first, original->second.second);
    add("model.rope_original_max_seq_len", original->second.first);
  } else {
    m.rope_original_max_seq_len = m.max_seq_len;
    add("model.rope_original_max_seq_len", "default: max_position_embeddings");
  }
}

void refuse_unsupported(const HfConfigReader& r) {
  r.only("hidden_act", "silu", "SwiGLU with SiLU");
  r.only("attention_dropout", 0.0, "no dropout");
  r.only("use_sliding_window", false, "full attention in every layer");
  r.only("mlp_bias", false, "the MLP projections have no bias");
  r.only("pretraining_tp", 1, "unsplit projections");
  if (r.find("quantization_config") != nullptr) {
    r.fail("quantization_config", "quantized checkpoints are not supported");
  }
  if (const json* types = r.find("layer_types")) {
    if (!types->is_array()) r.fail("layer_types", "must be a list");
    for (size_t i = 0; i < types->size(); ++i) {
      if ((*types)[i] != "full_attention") {
        r.fail("layer_types[" + std::to_string(i) + "]",
               printable((*types)[i].dump()) +
                   " is not supported (mixtrain has full_attention layers only)");
      }
    }
  }
}

void refuse_unsupported_moe(const HfConfigReader& r) {
  r.only("decoder_sparse_step", 1, "every layer is a MoE layer");
  if (const json* dense = r.find("mlp_only_layers")) {
    if (!dense->is_array() || !dense->empty()) {
      r.fail("mlp_only_layers", printable(dense->dump()) +
                                    " is not supported (every layer is a MoE layer: must be [])");
    }
  }
}

// The registered model whose name is `model_type`, or nullptr.
const ModelEntry* family_of(const std::string& model_type) {
  for (const ModelEntry& entry : model_registry()) {
    if (entry.name == model_type) return &entry;
  }
  return nullptr;
}

}  // namespace

HfModelConfig read_hf_config(const std::string& path) {
  const json root = read_json_file(path);
  const HfConfigReader r(path, root);
  HfModelConfig out;
  ModelConfig& m = out.model;
  auto add = [&](const std::string& key, const std::string& hf_field, bool architecture = true) {
    out.fields.push_back({key, hf_field, architecture});
  };

  const json& type = r.require("model_type");
  const ModelEntry* entry = type.is_string() ? family_of(type.get<std::string>()) : nullptr;
  if (entry == nullptr) {
    std::string known;
    for (const std::string& name : registered_model_names()) {
      known += (known.empty() ? "" : ", ") + name;
    }
    r.fail("model_type",
           printable(type.dump()) + " is not supported (mixtrain builds " + known + ")");
  }
  const HfFamily& family = entry->hf;
  m.name = type.get<std::string>();
  const bool moe = family.moe;
  add("model.name", "model_type");
  refuse_unsupported(r);
  if (moe) refuse_unsupported_moe(r);

  m.vocab_size = r.positive_int("vocab_size");
  add("model.vocab_size", "vocab_size");
  m.hidden_size = r.positive_int("hidden_size");
  add("model.hidden_size", "hidden_size");
  m.num_layers = r.positive_int("num_hidden_layers");
  add("model.num_layers", "num_hidden_layers");
  m.num_heads = r.positive_int("num_attention_heads");
  add("model.num_heads", "num_attention_heads");
  if (const json* kv = r.find("num_key_value_heads")) {
    m.num_kv_heads = r.positive_int("num_key_value_heads", *kv);
    add("model.num_kv_heads", "num_key_value_heads");
  } else {  // HF: multi-head attention
    m.num_kv_heads = m.num_heads;
    add("model.num_kv_heads", "default: num_attention_heads");
  }
  if (const json* head_dim = r.find("head_dim")) {
    m.head_dim = r.positive_int("head_dim", *head_dim);
    add("model.head_dim", "head_dim");
  } else if (!family.head_dim_default_field.empty()) {  // deepseek_v3: the rotary dims
    m.head_dim = r.positive_int(family.head_dim_default_field);
    add("model.head_dim", family.head_dim_default_field);
  } else {  // HF: hidden_size // num_attention_heads
    if (m.hidden_size % m.num_heads != 0) {
      r.fail("head_dim", "missing, and hidden_size " + std::to_string(m.hidden_size) +
                             " is not a multiple of num_attention_heads " +
                             std::to_string(m.num_heads));
    }
    m.head_dim = m.hidden_size / m.num_heads;
    add("model.head_dim", "default: hidden_size / num_attention_heads");
  }
  m.max_seq_len = r.positive_int("max_position_embeddings");
  add("model.max_seq_len", "max_position_embeddings", false);
  read_rope(r, m, [&](const std::string& key, const std::string& field) { add(key, field); });
  m.rms_norm_eps = r.number("rms_norm_eps", r.require("rms_norm_eps"));
  add("model.rms_norm_eps", "rms_norm_eps");

  if (!moe) {
    m.intermediate_size = r.positive_int("intermediate_size");
    add("model.intermediate_size", "intermediate_size");
  }
  // Every family's config class defaults to untied (transformers' Qwen2/Qwen3/Llama/*Moe).
  m.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  add("model.tie_word_embeddings",
      r.find("tie_word_embeddings") ? "tie_word_embeddings" : "default: false");
  // A family without the field (Qwen2's q/k/v always carry a bias) has its default.
  const std::string& bias_field = family.attention_bias_field;
  m.attention_bias = bias_field.empty() ? family.attention_bias_default
                                        : r.boolean(bias_field, family.attention_bias_default);
  add("model.attention_bias", !bias_field.empty() && r.find(bias_field) ? bias_field
                              : family.attention_bias_default ? "default: true (" + m.name + ")"
                                                              : std::string("default: false"));
  if (const std::string& field = family.sliding_window_field; !field.empty()) {
    // An integer window, or null (and absent): full causal attention.
    const json* window = r.find(field);
    const bool set = window != nullptr && !window->is_null();
    sliding_window_config(m).sliding_window = set ? r.positive_int(field, *window) : 0;
    add("model.sliding_window", set ? field : "default: null (full causal)");
  }
  if (moe) {
    // The expert count's field, or its older spelling (transformers 4.x); both must agree.
    std::string experts_field = family.experts_field;
    const std::string& older = family.experts_field_older;
    if (!older.empty() && r.find(experts_field) == nullptr) {
      experts_field = older;
    } else if (!older.empty()) {
      const json* old = r.find(older);
      if (old != nullptr && *old != root.at(experts_field)) {
        r.fail(older, printable(old->dump()) + " disagrees with " + experts_field + " " +
                          root.at(experts_field).dump());
      }
    }
    moe_config(m).num_experts = r.positive_int(experts_field);
    add("model.num_experts", experts_field);
    moe_config(m).num_experts_per_tok = r.positive_int("num_experts_per_tok");
    add("model.num_experts_per_tok", "num_experts_per_tok");
    moe_config(m).moe_intermediate_size = r.positive_int("moe_intermediate_size");
    add("model.moe_intermediate_size", "moe_intermediate_size");
    moe_config(m).norm_topk_prob = r.boolean("norm_topk_prob", false);
    add("model.norm_topk_prob", r.find("norm_topk_prob") ? "norm_topk_prob" : "default: false");
    if (const json* coef = r.find("router_aux_loss_coef")) {
      moe_config(m).router_aux_loss_coef = r.number("router_aux_loss_coef", *coef);
      add("model.router_aux_loss_coef", "router_aux_loss_coef", false);
    }
  }
  if (family.shared_expert) {
    moe_config(m).shared_expert_intermediate_size =
        r.positive_int("shared_expert_intermediate_size");
    add("model.shared_expert_intermediate_size", "shared_expert_intermediate_size");
  }
  if (family.read_own) family.read_own(r, m, add);
  return out;
}

std::string implied_hf_config_path(const ModelConfig& model) {
  if (!model.hf_config.empty()) return model.hf_config;
  if (!model.init_from.empty()) return model.init_from + "/config.json";
  return "";
}

void apply_hf_config(TrainerConfig& config, Provenance& provenance) {
  ModelConfig& model = config.model;
  const std::string path = implied_hf_config_path(model);
  if (path.empty()) return;
  if (model.hf_config.empty()) {
    model.hf_config = path;
    provenance.sources["model.hf_config"] = ValueSource::kDerived;
    provenance.notes["model.hf_config"] = "model.init_from";
  }
  if (!model.init_from.empty()) {
    const std::string& dir = model.init_from;
    if (!std::filesystem::exists(dir + "/model.safetensors") &&
        !std::filesystem::exists(dir + "/model.safetensors.index.json")) {
      throw ConfigError(provenance.origin_of("model.init_from") + ": " +
                        provenance.user_key("model.init_from") + ": " + dir +
                        " has neither model.safetensors nor model.safetensors.index.json");
    }
  }
  const HfModelConfig hf = read_hf_config(path);
  const auto set_by_user = [&](const std::string& key) {
    const ValueSource source = provenance.source(key);
    return source == ValueSource::kFile || source == ValueSource::kOverride;
  };
  ModelConfig merged = hf.model;
  merged.hf_config = model.hf_config;
  merged.init_from = model.init_from;
  bool aux_from_file = false;
  for (const HfField& field : hf.fields) {
    aux_from_file |= field.key == "model.router_aux_loss_coef";
    // The user's value: a training key's wins; an architecture key's is checked below.
    if (set_by_user(field.key)) continue;
    // A key this model does not read (another family's) is left unmarked.
    if (!model_reads_key(merged.name, field.key)) continue;
    provenance.sources[field.key] = ValueSource::kDerived;
    provenance.notes[field.key] = path + ": " + field.hf_field;
  }
  if (set_by_user("model.max_seq_len")) merged.max_seq_len = model.max_seq_len;
  // A model key config.json does not give (a training choice such as deepseek_v3's
  // bias_update_speed) keeps the value the user set.
  {
    std::set<std::string> from_hf;
    for (const HfField& field : hf.fields) from_hf.insert(field.key);
    TrainerConfig kept = config;
    kept.model = merged;
    for (const LeafSpec& leaf : canonical_leaves()) {
      if (leaf.key.rfind("model.", 0) != 0 || !leaf.settable || from_hf.count(leaf.key) != 0 ||
          leaf.key == "model.hf_config" || leaf.key == "model.init_from" ||
          leaf.key == "model.max_seq_len" || !set_by_user(leaf.key)) {
        continue;
      }
      const Where at{provenance.origin_of(leaf.key), leaf.key};
      leaf.assign(kept, parse_yaml_value(leaf.format(config), at), at);
    }
    merged = kept.model;
  }
  if (!aux_from_file || set_by_user("model.router_aux_loss_coef")) {
    moe_config(merged).router_aux_loss_coef = moe_config(model).router_aux_loss_coef;
  }
  // An architecture key the user set as well must say what config.json says (a full config
  // may keep its model section); a different value is refused.
  TrainerConfig from_file = config;
  from_file.model = merged;
  for (const HfField& field : hf.fields) {
    const LeafSpec* leaf = find_canonical_leaf(field.key);
    if (!field.architecture || !set_by_user(field.key) || leaf == nullptr) continue;
    const std::string given = leaf->format(config), file_value = leaf->format(from_file);
    if (given != file_value) {
      throw ConfigError(provenance.origin_of(field.key) + ": " + provenance.user_key(field.key) +
                        ": is " + given + ", but model.hf_config (" + path + ") says " +
                        file_value + " (" + field.hf_field +
                        "); remove the key (config.json defines the architecture) or make it "
                        "agree");
    }
    provenance.notes[field.key] = "agrees with " + path + ": " + field.hf_field;
  }
  model = merged;
}

json hf_config_json(const ModelConfig& m, const std::string& dtype) {
  const ModelEntry* entry = family_of(m.name);
  if (entry == nullptr) {
    throw std::invalid_argument("hf_config_json: no Hugging Face model type for model '" + m.name +
                                "'");
  }
  const HfFamily& family = entry->hf;
  const bool moe = family.moe;
  json j;
  j["architectures"] = json::array({family.architecture});
  j["model_type"] = m.name;
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.hidden_size;
  j["num_hidden_layers"] = m.num_layers;
  j["num_attention_heads"] = m.num_heads;
  j["num_key_value_heads"] = m.num_kv_heads;
  j["head_dim"] = m.head_dim;
  j["max_position_embeddings"] = m.max_seq_len;
  j["rms_norm_eps"] = m.rms_norm_eps;
  if (m.rope_scaling == "yarn") {
    j["rope_parameters"] = {{"rope_type", "yarn"},
                            {"rope_theta", m.rope_theta},
                            {"factor", m.rope_scaling_factor},
                            {"beta_fast", m.rope_yarn_beta_fast},
                            {"beta_slow", m.rope_yarn_beta_slow},
                            {"original_max_position_embeddings", m.rope_original_max_seq_len}};
    if (m.rope_yarn_mscale != 0) j["rope_parameters"]["mscale"] = m.rope_yarn_mscale;
    if (m.rope_yarn_mscale_all_dim != 0) {
      j["rope_parameters"]["mscale_all_dim"] = m.rope_yarn_mscale_all_dim;
    }
  } else if (m.rope_scaling == "llama3") {
    j["rope_parameters"] = {{"rope_type", "llama3"},
                            {"rope_theta", m.rope_theta},
                            {"factor", m.rope_scaling_factor},
                            {"low_freq_factor", m.rope_low_freq_factor},
                            {"high_freq_factor", m.rope_high_freq_factor},
                            {"original_max_position_embeddings", m.rope_original_max_seq_len}};
  } else {
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", m.rope_theta}};
  }
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = m.tie_word_embeddings;
  j["attention_dropout"] = 0.0;
  j["dtype"] = dtype;
  if (family.writes_sliding_window) j["use_sliding_window"] = false;
  if (const std::string& field = family.sliding_window_field; !field.empty()) {
    const int64_t window = sliding_window_config(m).sliding_window;
    j[field] = window > 0 ? json(window) : json(nullptr);
  }
  if (!moe) j["intermediate_size"] = m.intermediate_size;
  if (!family.attention_bias_field.empty()) j[family.attention_bias_field] = m.attention_bias;
  if (family.writes_mlp_bias) j["mlp_bias"] = false;
  if (moe) {
    j[family.experts_field] = moe_config(m).num_experts;
    j["num_experts_per_tok"] = moe_config(m).num_experts_per_tok;
    j["moe_intermediate_size"] = moe_config(m).moe_intermediate_size;
    j["norm_topk_prob"] = moe_config(m).norm_topk_prob;
    j["router_aux_loss_coef"] = moe_config(m).router_aux_loss_coef;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = json::array();
  }
  if (family.shared_expert) {
    j["shared_expert_intermediate_size"] = moe_config(m).shared_expert_intermediate_size;
  }
  if (family.write_own) family.write_own(m, j);
  return j;
}

}  // namespace mixtrain
