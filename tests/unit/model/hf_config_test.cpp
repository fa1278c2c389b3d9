// config.json -> ModelConfig for each family transformers writes (tests/python/hf_models.py
// config), every refusal, model.hf_config / model.init_from in load_config (derived keys, the
// conflict rule, `config show`'s source), and the reverse mapping read back.
#include "mixtrain/model/hf_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "mixtrain/config/load.h"
#include "mixtrain/model/deepseek_v3_config.h"
#include "mixtrain/model/moe_config.h"
#include "support/python_script.h"
#include "unit/config/temp_config.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using json = nlohmann::json;
using testing::config_error_of;
using testing::TempDir;

// transformers' config.json of the tiny FAMILY, written once per test run by
// tests/python/hf_models.py (importing transformers takes seconds).
json transformers_config(const TempDir&, const std::string& family) {
  static const TempDir written;
  static const bool ran = [] {
    EXPECT_TRUE(test_support::python_script_succeeds({"hf_models.py", "config", written.path()}));
    return true;
  }();
  (void)ran;
  std::ifstream in(written.path() + "/" + family + "/config.json");
  return json::parse(in);
}

std::string write_json(const TempDir& dir, const std::string& name, const json& value) {
  return dir.write(name, value.dump(2));
}

// The tiny sizes hf_models.py gives every family (its COMMON table).
void expect_common(const ModelConfig& m) {
  EXPECT_EQ(m.vocab_size, 61);
  EXPECT_EQ(m.hidden_size, 24);
  EXPECT_EQ(m.num_layers, 2);
  EXPECT_EQ(m.num_heads, 4);
  EXPECT_EQ(m.num_kv_heads, 2);
  EXPECT_EQ(m.head_dim, 8);
  EXPECT_EQ(m.max_seq_len, 64);
  EXPECT_EQ(m.rope_theta, 5000.0);
  EXPECT_EQ(m.rms_norm_eps, 1e-6);
}

TEST(HfConfig, ReadsEveryFamilyTransformersWrites) {
  TempDir dir;
  {
    const ModelConfig m =
        read_hf_config(write_json(dir, "a.json", transformers_config(dir, "qwen2_moe"))).model;
    EXPECT_EQ(m.name, "qwen2_moe");
    expect_common(m);
    EXPECT_EQ(moe_config(m).moe_intermediate_size, 12);
    EXPECT_EQ(moe_config(m).shared_expert_intermediate_size, 20);
    EXPECT_EQ(moe_config(m).num_experts, 4);
    EXPECT_EQ(moe_config(m).num_experts_per_tok, 2);
    EXPECT_FALSE(moe_config(m).norm_topk_prob);
    EXPECT_TRUE(m.attention_bias);  // qkv_bias
    EXPECT_EQ(moe_config(m).router_aux_loss_coef, 0.01);
  }
  {
    const ModelConfig m =
        read_hf_config(write_json(dir, "b.json", transformers_config(dir, "qwen3_moe"))).model;
    EXPECT_EQ(m.name, "qwen3_moe");
    expect_common(m);
    EXPECT_EQ(moe_config(m).moe_intermediate_size, 12);
    EXPECT_EQ(moe_config(m).num_experts, 4);  // num_local_experts in transformers 5
    EXPECT_TRUE(moe_config(m).norm_topk_prob);
    EXPECT_FALSE(m.attention_bias);
  }
  {
    const ModelConfig m =
        read_hf_config(write_json(dir, "c.json", transformers_config(dir, "qwen2"))).model;
    EXPECT_EQ(m.name, "qwen2");
    expect_common(m);
    EXPECT_EQ(m.intermediate_size, 20);
    EXPECT_TRUE(m.attention_bias);
  }
  {
    const ModelConfig m =
        read_hf_config(write_json(dir, "d.json", transformers_config(dir, "llama"))).model;
    EXPECT_EQ(m.name, "llama");
    expect_common(m);
    EXPECT_EQ(m.intermediate_size, 20);
    EXPECT_FALSE(m.attention_bias);
  }
  {
    const ModelConfig m =
        read_hf_config(write_json(dir, "e.json", transformers_config(dir, "qwen3"))).model;
    EXPECT_EQ(m.name, "qwen3");
    expect_common(m);
    EXPECT_EQ(m.intermediate_size, 20);
    EXPECT_FALSE(m.attention_bias);  // Qwen3Config's attention_bias
  }
}

// transformers 4.x spellings: top-level rope_theta with rope_scaling null, no head_dim, no
// num_key_value_heads.
TEST(HfConfig, ReadsTheOlderSpellings) {
  TempDir dir;
  json c = transformers_config(dir, "qwen2");
  c.erase("rope_parameters");
  c.erase("head_dim");
  c.erase("num_key_value_heads");
  c["rope_theta"] = 1e6;
  c["rope_scaling"] = nullptr;
  const ModelConfig m = read_hf_config(write_json(dir, "c.json", c)).model;
  EXPECT_EQ(m.rope_theta, 1e6);
  EXPECT_EQ(m.head_dim, 6);  // 24 / 4
  EXPECT_EQ(m.num_kv_heads, 4);
}

void expect_llama31_rope(const ModelConfig& m) {
  EXPECT_EQ(m.rope_scaling, "llama3");
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_EQ(m.rope_scaling_factor, 8.0);
  EXPECT_EQ(m.rope_low_freq_factor, 1.0);
  EXPECT_EQ(m.rope_high_freq_factor, 4.0);
  EXPECT_EQ(m.rope_original_max_seq_len, 8192);
  EXPECT_EQ(m.max_seq_len, 131072);
}

// Llama 3.1's rope scaling as its config.json gives it (transformers 5's rope_parameters), as
// 4.x wrote it (top-level rope_theta, rope_scaling with "type" or "rope_type"), and
// transformers' fallbacks for original_max_position_embeddings (top level first, else
// max_position_embeddings).
TEST(HfConfig, ReadsLlama3RopeScaling) {
  TempDir dir;
  const ModelConfig tiny =
      read_hf_config(write_json(dir, "tiny.json", transformers_config(dir, "llama3"))).model;
  EXPECT_EQ(tiny.rope_scaling, "llama3");  // hf_models.py's llama3: shrunk original context
  EXPECT_EQ(tiny.rope_original_max_seq_len, 100);
  EXPECT_EQ(tiny.rope_scaling_factor, 8.0);
  json llama3 = transformers_config(dir, "llama");
  llama3["rope_parameters"] = {
      {"rope_type", "llama3"},   {"rope_theta", 500000.0},
      {"factor", 8.0},           {"low_freq_factor", 1.0},
      {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  llama3["max_position_embeddings"] = 131072;
  const HfModelConfig read = read_hf_config(write_json(dir, "a.json", llama3));
  expect_llama31_rope(read.model);
  const auto origin = [&](const HfModelConfig& hf, const std::string& key) {
    for (const HfField& f : hf.fields)
      if (f.key == key) return f.hf_field;
    return std::string("(absent)");
  };
  EXPECT_EQ(origin(read, "model.rope_scaling"), "rope_parameters.rope_type");
  EXPECT_EQ(origin(read, "model.rope_original_max_seq_len"),
            "rope_parameters.original_max_position_embeddings");
  // The plain llama (rope_type default): no scaling, and no scaling parameter among the fields;
  // without any rope object, the default.
  json plain_json = transformers_config(dir, "llama");
  const HfModelConfig plain = read_hf_config(write_json(dir, "p.json", plain_json));
  EXPECT_EQ(plain.model.rope_scaling, "none");
  EXPECT_EQ(origin(plain, "model.rope_scaling"), "rope_parameters.rope_type");
  EXPECT_EQ(origin(plain, "model.rope_scaling_factor"), "(absent)");
  plain_json.erase("rope_parameters");
  const HfModelConfig bare = read_hf_config(write_json(dir, "b.json", plain_json));
  EXPECT_EQ(bare.model.rope_scaling, "none");
  EXPECT_EQ(origin(bare, "model.rope_scaling"), "default: no rope_type");

  for (const char* type_key : {"type", "rope_type"}) {
    json old = llama3;
    json scaling = old["rope_parameters"];
    scaling.erase("rope_type");
    scaling.erase("rope_theta");
    scaling[type_key] = "llama3";
    old.erase("rope_parameters");
    old["rope_scaling"] = scaling;
    old["rope_theta"] = 500000.0;
    const HfModelConfig m = read_hf_config(write_json(dir, "old.json", old));
    expect_llama31_rope(m.model);
    EXPECT_EQ(origin(m, "model.rope_scaling"), std::string("rope_scaling.") + type_key);
  }
  json fallback = llama3;
  fallback["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_EQ(read_hf_config(write_json(dir, "f.json", fallback)).model.rope_original_max_seq_len,
            131072);
  fallback["original_max_position_embeddings"] = 4096;
  fallback["rope_parameters"]["original_max_position_embeddings"] = 8192;
  EXPECT_EQ(read_hf_config(write_json(dir, "t.json", fallback)).model.rope_original_max_seq_len,
            4096);

  // Refusals name the field: a missing llama3 parameter, a llama3 parameter without llama3.
  json missing = llama3;
  missing["rope_parameters"].erase("low_freq_factor");
  std::string path = write_json(dir, "m.json", missing);
  EXPECT_EQ(config_error_of([&] { read_hf_config(path); }),
            path + ": rope_parameters.rope_type: llama3 needs low_freq_factor (missing)");
  json stray = transformers_config(dir, "llama");
  stray["rope_parameters"]["factor"] = 8.0;
  path = write_json(dir, "s.json", stray);
  EXPECT_EQ(config_error_of([&] { read_hf_config(path); }),
            path +
                ": rope_parameters.factor: is not a parameter of rope_type default (only "
                "llama3 and yarn have it)");
  json text = llama3;
  text["rope_parameters"]["factor"] = "8";
  path = write_json(dir, "x.json", text);
  EXPECT_EQ(config_error_of([&] { read_hf_config(path); }),
            path + ": rope_parameters.factor: must be a finite number, got \"8\"");
}

TEST(HfConfig, RefusesEveryUnsupportedValueNamingFileAndField) {
  TempDir dir;
  const json qwen2_moe = transformers_config(dir, "qwen2_moe");
  const json llama = transformers_config(dir, "llama");
  struct Case {
    const json* base;
    std::string field;
    json value;
    std::string says;
  };
  const std::vector<Case> cases = {
      {&qwen2_moe, "tie_word_embeddings", "yes", "must be true or false, got \"yes\""},
      {&qwen2_moe, "hidden_act", "gelu", "\"gelu\" is not supported"},
      {&qwen2_moe, "use_sliding_window", true, "true is not supported"},
      {&qwen2_moe, "attention_dropout", 0.1, "is not supported"},
      {&qwen2_moe, "decoder_sparse_step", 2, "2 is not supported"},
      {&qwen2_moe, "mlp_only_layers", json::array({1}), "[1] is not supported"},
      {&qwen2_moe, "model_type", "mixtral", "\"mixtral\" is not supported"},
      {&qwen2_moe, "vocab_size", 0, "must be an integer > 0, got 0"},
      {&qwen2_moe, "hidden_size", "24", "must be an integer > 0"},
      {&qwen2_moe, "quantization_config", json::object({{"bits", 4}}), "not supported"},
      {&llama, "mlp_bias", true, "true is not supported"},
      {&llama, "pretraining_tp", 2, "2 is not supported"},
  };
  for (const Case& c : cases) {
    json changed = *c.base;
    changed[c.field] = c.value;
    const std::string path = write_json(dir, "x.json", changed);
    const std::string message = config_error_of([&] { read_hf_config(path); });
    EXPECT_EQ(message.find(path + ": " + c.field + ": "), 0u) << message;
    EXPECT_NE(message.find(c.says), std::string::npos) << message;
  }
  json rope = qwen2_moe;
  rope["rope_parameters"]["rope_type"] = "longrope";
  std::string path = write_json(dir, "r.json", rope);
  EXPECT_NE(config_error_of([&] {
              read_hf_config(path);
            }).find(path + ": rope_parameters.rope_type: \"longrope\" is not supported"),
            std::string::npos);
  json layers = qwen2_moe;
  layers["layer_types"][1] = "sliding_attention";
  path = write_json(dir, "l.json", layers);
  EXPECT_NE(config_error_of([&] {
              read_hf_config(path);
            }).find(path + ": layer_types[1]: \"sliding_attention\" is not supported"),
            std::string::npos);
  json missing = qwen2_moe;
  missing.erase("num_experts");
  path = write_json(dir, "m.json", missing);
  EXPECT_NE(config_error_of([&] { read_hf_config(path); }).find(path + ": num_experts: missing"),
            std::string::npos);
  path = dir.write("bad.json", "{\"model_type\": ");
  EXPECT_NE(config_error_of([&] { read_hf_config(path); }).find(path + ": not valid JSON"),
            std::string::npos);
}

TEST(HfConfig, LoadConfigTakesTheArchitectureFromConfigJson) {
  TempDir dir;
  const std::string hf = write_json(dir, "config.json", transformers_config(dir, "qwen2_moe"));
  const std::string yaml = dir.write(
      "run.yaml", "model:\n  hf_config: " + hf + "\n  max_seq_len: 32\ndata:\n  seq_len: 16\n");
  const ResolvedConfig resolved = load_config(yaml, {});
  const ModelConfig& m = resolved.config.model;
  EXPECT_EQ(m.hidden_size, 24);
  EXPECT_EQ(m.max_seq_len, 32);  // the user's value wins for this training key
  EXPECT_EQ(moe_config(m).router_aux_loss_coef, 0.01);
  const ResolvedLeaf* layers = resolved.leaf("model.num_layers");
  ASSERT_NE(layers, nullptr);
  EXPECT_EQ(layers->value, "2");
  EXPECT_EQ(layers->source, ValueSource::kDerived);
  EXPECT_EQ(layers->origin, hf + ": num_hidden_layers");
  EXPECT_EQ(resolved.leaf("model.max_seq_len")->source, ValueSource::kFile);

  // An architecture key set as well must agree; a different value is refused, naming the key,
  // both values and the file that defines it.
  const std::string same = dir.write(
      "same.yaml", "model:\n  hf_config: " + hf + "\n  hidden_size: 24\n  name: qwen2_moe\n");
  const ResolvedConfig agreed = load_config(same, {});
  EXPECT_EQ(agreed.leaf("model.hidden_size")->source, ValueSource::kFile);
  EXPECT_EQ(agreed.leaf("model.hidden_size")->origin, "agrees with " + hf + ": hidden_size");
  const std::string both =
      dir.write("both.yaml", "model:\n  hf_config: " + hf + "\n  hidden_size: 32\n");
  const std::string message = config_error_of([&] { load_config(both, {}); });
  EXPECT_EQ(message, both + ": model.hidden_size: is 32, but model.hf_config (" + hf +
                         ") says 24 (hidden_size); remove the key (config.json defines the "
                         "architecture) or make it agree");
  const std::string by_set = config_error_of([&] { load_config(yaml, {"model.num_layers=3"}); });
  EXPECT_EQ(by_set.find("--set: model.num_layers: is 3, but model.hf_config"), 0u) << by_set;
  const std::string name = config_error_of([&] { load_config(yaml, {"model.name=qwen2"}); });
  EXPECT_EQ(name.find("--set: model.name: is qwen2, but model.hf_config (" + hf +
                      ") says qwen2_moe (model_type)"),
            0u)
      << name;
}

// The rope keys come from config.json like the other architecture keys, and survive a user's
// max_seq_len (the original context is the file's).
TEST(HfConfig, LoadConfigTakesLlama3RopeFromConfigJson) {
  TempDir dir;
  const std::string hf = write_json(dir, "config.json", transformers_config(dir, "llama3"));
  const std::string yaml = dir.write(
      "run.yaml", "model:\n  hf_config: " + hf + "\n  max_seq_len: 32\ndata:\n  seq_len: 16\n");
  const ResolvedConfig resolved = load_config(yaml, {});
  EXPECT_EQ(resolved.config.model.rope_scaling, "llama3");
  EXPECT_EQ(resolved.config.model.rope_original_max_seq_len, 100);  // not max_seq_len
  EXPECT_EQ(resolved.config.model.max_seq_len, 32);
  const ResolvedLeaf* factor = resolved.leaf("model.rope_scaling_factor");
  ASSERT_NE(factor, nullptr);
  EXPECT_EQ(factor->source, ValueSource::kDerived);
  EXPECT_EQ(factor->origin, hf + ": rope_parameters.factor");
  const std::string message =
      config_error_of([&] { load_config(yaml, {"model.rope_scaling=none"}); });
  EXPECT_EQ(message.find("--set: model.rope_scaling: is none, but model.hf_config (" + hf +
                         ") says llama3 (rope_parameters.rope_type)"),
            0u)
      << message;
}

TEST(HfConfig, InitFromImpliesItsConfigJson) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/model");
  write_json(dir, "model/config.json", transformers_config(dir, "qwen2"));
  const std::string yaml = dir.write(
      "run.yaml", "model:\n  init_from: " + dir.path() + "/model\ndata:\n  seq_len: 16\n");
  // No weights yet: refused before anything is built.
  std::string message = config_error_of([&] { load_config(yaml, {}); });
  EXPECT_NE(message.find("has neither model.safetensors nor model.safetensors.index.json"),
            std::string::npos)
      << message;
  dir.write("model/model.safetensors", "");
  const ResolvedConfig resolved = load_config(yaml, {});
  EXPECT_EQ(resolved.config.model.name, "qwen2");
  EXPECT_EQ(resolved.config.model.hf_config, dir.path() + "/model/config.json");
  EXPECT_EQ(resolved.leaf("model.hf_config")->source, ValueSource::kDerived);
  EXPECT_EQ(resolved.leaf("model.hf_config")->origin, "model.init_from");
}

// hf_config_json's output, read back, is the same model (and transformers loads it: the export
// round trip in tests/tools/export_hf_command_test.cpp).
TEST(HfConfig, WrittenConfigReadsBackAsTheSameModel) {
  TempDir dir;
  for (const char* family : {"qwen2_moe", "qwen3_moe", "qwen2", "llama", "qwen3", "llama3",
                             "qwen2_tied", "llama_tied"}) {
    const ModelConfig original =
        read_hf_config(write_json(dir, "in.json", transformers_config(dir, family))).model;
    const ModelConfig back =
        read_hf_config(write_json(dir, "out.json", hf_config_json(original, "float32"))).model;
    EXPECT_EQ(back.name, original.name);
    EXPECT_EQ(back.vocab_size, original.vocab_size);
    EXPECT_EQ(back.hidden_size, original.hidden_size);
    EXPECT_EQ(back.num_layers, original.num_layers);
    EXPECT_EQ(back.num_heads, original.num_heads);
    EXPECT_EQ(back.num_kv_heads, original.num_kv_heads);
    EXPECT_EQ(back.head_dim, original.head_dim);
    EXPECT_EQ(back.intermediate_size, original.intermediate_size);
    EXPECT_EQ(moe_config(back).moe_intermediate_size, moe_config(original).moe_intermediate_size);
    EXPECT_EQ(moe_config(back).num_experts, moe_config(original).num_experts);
    EXPECT_EQ(moe_config(back).num_experts_per_tok, moe_config(original).num_experts_per_tok);
    EXPECT_EQ(moe_config(back).shared_expert_intermediate_size,
              moe_config(original).shared_expert_intermediate_size);
    EXPECT_EQ(back.max_seq_len, original.max_seq_len);
    EXPECT_EQ(back.rope_theta, original.rope_theta);
    EXPECT_EQ(back.rope_scaling, original.rope_scaling);
    EXPECT_EQ(back.rope_scaling_factor, original.rope_scaling_factor);
    EXPECT_EQ(back.rope_low_freq_factor, original.rope_low_freq_factor);
    EXPECT_EQ(back.rope_high_freq_factor, original.rope_high_freq_factor);
    EXPECT_EQ(back.rope_original_max_seq_len, original.rope_original_max_seq_len);
    EXPECT_EQ(back.rms_norm_eps, original.rms_norm_eps);
    EXPECT_EQ(moe_config(back).router_aux_loss_coef, moe_config(original).router_aux_loss_coef);
    EXPECT_EQ(back.attention_bias, original.attention_bias);
    EXPECT_EQ(moe_config(back).norm_topk_prob, moe_config(original).norm_topk_prob);
    EXPECT_EQ(back.tie_word_embeddings, original.tie_word_embeddings);
    EXPECT_EQ(original.tie_word_embeddings, std::string(family).find("_tied") != std::string::npos)
        << family;
  }
}

// tie_word_embeddings as transformers writes it (true for the tied families, false otherwise)
// and absent (every supported family's config class defaults to false).
TEST(HfConfig, TieWordEmbeddingsFromTheFileOrFalse) {
  TempDir dir;
  const auto origin = [](const HfModelConfig& hf) {
    for (const HfField& f : hf.fields)
      if (f.key == "model.tie_word_embeddings") return f.hf_field;
    return std::string("(absent)");
  };
  const HfModelConfig tied =
      read_hf_config(write_json(dir, "t.json", transformers_config(dir, "qwen2_tied")));
  EXPECT_TRUE(tied.model.tie_word_embeddings);
  EXPECT_EQ(origin(tied), "tie_word_embeddings");
  json untied = transformers_config(dir, "llama");
  EXPECT_FALSE(read_hf_config(write_json(dir, "u.json", untied)).model.tie_word_embeddings);
  untied.erase("tie_word_embeddings");
  const HfModelConfig absent = read_hf_config(write_json(dir, "a.json", untied));
  EXPECT_FALSE(absent.model.tie_word_embeddings);
  EXPECT_EQ(origin(absent), "default: false");
}

void expect_tiny_deepseek_v3(const ModelConfig& m) {
  EXPECT_EQ(m.name, "deepseek_v3");
  EXPECT_EQ(m.vocab_size, 61);
  EXPECT_EQ(m.hidden_size, 24);
  EXPECT_EQ(m.num_heads, 4);
  EXPECT_EQ(m.num_kv_heads, 4);
  EXPECT_EQ(m.head_dim, 6);  // transformers' head_dim: qk_rope_head_dim
  EXPECT_EQ(m.intermediate_size, 20);
  EXPECT_FALSE(m.attention_bias);
  const DeepseekV3Config& d = deepseek_v3_config(m);
  EXPECT_EQ(d.q_lora_rank, 10);
  EXPECT_EQ(d.kv_lora_rank, 11);
  EXPECT_EQ(d.qk_nope_head_dim, 7);
  EXPECT_EQ(d.qk_rope_head_dim, 6);
  EXPECT_EQ(d.v_head_dim, 9);
  EXPECT_EQ(d.n_shared_experts, 2);
  EXPECT_EQ(d.n_group, 4);
  EXPECT_EQ(d.topk_group, 2);
  EXPECT_EQ(d.routed_scaling_factor, 2.5);
  EXPECT_EQ(d.first_k_dense_replace, 1);
  EXPECT_TRUE(d.rope_interleave);
  EXPECT_EQ(moe_config(m).num_experts, 8);  // n_routed_experts
  EXPECT_EQ(moe_config(m).num_experts_per_tok, 3);
  EXPECT_EQ(moe_config(m).moe_intermediate_size, 5);
  EXPECT_TRUE(moe_config(m).norm_topk_prob);
  EXPECT_EQ(moe_config(m).router_aux_loss_coef, 0.0);  // transformers computes none
}

// DeepSeek-V3 as transformers writes it, as DeepSeek's own configs spell it (no head_dim,
// q_lora_rank null, scoring_func, topk_method, seq_aux with aux_loss_alpha), written back, and
// its refusals.
TEST(HfConfig, ReadsWritesAndRefusesDeepseekV3) {
  TempDir dir;
  const json written = transformers_config(dir, "deepseek_v3");
  expect_tiny_deepseek_v3(read_hf_config(write_json(dir, "a.json", written)).model);
  const ModelConfig original = read_hf_config(write_json(dir, "a.json", written)).model;
  const json out = hf_config_json(original, "bfloat16");
  EXPECT_EQ(out.at("architectures"), json::array({"DeepseekV3ForCausalLM"}));
  EXPECT_EQ(out.at("n_routed_experts"), 8);
  EXPECT_EQ(out.count("router_aux_loss_coef"), 0u);
  expect_tiny_deepseek_v3(read_hf_config(write_json(dir, "b.json", out)).model);

  json deepseek = written;
  deepseek.erase("head_dim");
  deepseek["q_lora_rank"] = nullptr;
  deepseek["scoring_func"] = "sigmoid";
  deepseek["topk_method"] = "noaux_tc";
  deepseek["seq_aux"] = true;
  deepseek["aux_loss_alpha"] = 0.0001;
  const ModelConfig own = read_hf_config(write_json(dir, "c.json", deepseek)).model;
  EXPECT_EQ(own.head_dim, 6);
  EXPECT_EQ(deepseek_v3_config(own).q_lora_rank, 0);
  EXPECT_EQ(moe_config(own).router_aux_loss_coef, 0.0001);

  const auto refused = [&](const std::string& field, const json& value) {
    json c = written;
    if (field == "rope_parameters") {
      c[field]["rope_type"] = value;
    } else {
      c[field] = value;
    }
    const std::string message =
        config_error_of([&] { read_hf_config(write_json(dir, "r.json", c)); });
    EXPECT_NE(message.find(field), std::string::npos) << message;
  };
  refused("scoring_func", "softmax");
  refused("topk_method", "greedy");
  refused("moe_layer_freq", 2);
  refused("rope_parameters", "longrope");
  refused("kv_lora_rank", 0);

  // DeepSeek-V3's own rope_scaling (transformers 4.x spelling): YaRN with both mscales.
  json yarn = written;
  yarn.erase("rope_parameters");
  yarn["rope_theta"] = 10000.0;
  yarn["rope_scaling"] = {
      {"type", "yarn"},       {"factor", 40},   {"original_max_position_embeddings", 4096},
      {"beta_fast", 32},      {"beta_slow", 1}, {"mscale", 1.0},
      {"mscale_all_dim", 1.0}};
  const ModelConfig y = read_hf_config(write_json(dir, "y.json", yarn)).model;
  EXPECT_EQ(y.rope_scaling, "yarn");
  EXPECT_EQ(y.rope_scaling_factor, 40.0);
  EXPECT_EQ(y.rope_original_max_seq_len, 4096);
  EXPECT_EQ(y.rope_yarn_beta_fast, 32.0);
  EXPECT_EQ(y.rope_yarn_beta_slow, 1.0);
  EXPECT_EQ(y.rope_yarn_mscale, 1.0);
  EXPECT_EQ(y.rope_yarn_mscale_all_dim, 1.0);
  const ModelConfig y_back =
      read_hf_config(write_json(dir, "yb.json", hf_config_json(y, "bfloat16"))).model;
  EXPECT_EQ(y_back.rope_scaling, "yarn");
  EXPECT_EQ(y_back.rope_scaling_factor, 40.0);
  EXPECT_EQ(y_back.rope_yarn_mscale_all_dim, 1.0);
  json mixed = yarn;
  mixed["rope_scaling"]["low_freq_factor"] = 1.0;  // llama3's, not yarn's
  const std::string message =
      config_error_of([&] { read_hf_config(write_json(dir, "m.json", mixed)); });
  EXPECT_NE(message.find("rope_scaling.low_freq_factor"), std::string::npos) << message;
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
