// Model registry: the one list of models (docs/extending.md, "Adding a model"). Each entry is
// a model's spec, defined in its own file: its name (ModelConfig::name), its factory, its
// config section (config/model_sections.h: its own keys, checks, experts, tensor-parallel
// sizes, capabilities) and its Hugging Face config.json family (hf_family.h). What each
// parameter is (experts, attention, embeddings, output head) the built model answers itself
// (CausalLM::param_roles).
//
// The model is built in float32 on the CPU and initialised deterministically from `seed` (same
// config and seed: bit-identical parameters on every machine and run; the global RNG is neither
// read nor advanced). model_init_dtype is applied afterwards by the caller (init_dtype.h). An
// unknown name throws ConfigError{ConfigKey{"model.name"}} listing the registered names
// (core/error.h); a structurally impossible config, std::invalid_argument (layers.h).
// register_model_sections() hands every section to config/ (once, before any config is read:
// run_cli and the test executables call it), with the model keys' shared rules (the rotary
// scaling keys) and the model.hf_config step of the config pipeline (hf_config.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/config/model_sections.h"
#include "mixtrain/config/trainer_config.h"
#include "mixtrain/model/causal_lm.h"
#include "mixtrain/model/hf_family.h"

namespace mixtrain {

struct ModelEntry {
  std::string name;
  std::function<std::shared_ptr<CausalLM>(const ModelConfig&, uint64_t seed)> make;
  ModelSection section;  // section.name == name
  HfFamily hf;
};

// Registers every entry's section and the model keys' shared section with config/, once.
void register_model_sections();

const std::vector<ModelEntry>& model_registry();

// Builds the model config.name names; throws std::logic_error if the model left a parameter
// without a role (a bug in the model, not in the config).
std::shared_ptr<CausalLM> build_model(const ModelConfig& config, uint64_t seed);

// The names build_model accepts, in table order, for help texts and error messages.
std::vector<std::string> registered_model_names();

}  // namespace mixtrain
