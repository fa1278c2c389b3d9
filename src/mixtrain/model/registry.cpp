#include "mixtrain/model/registry.h"

#include <stdexcept>

#include "mixtrain/core/error.h"
#include "mixtrain/model/qwen2.h"
#include "mixtrain/model/qwen2_moe.h"

namespace mixtrain {

const std::vector<ModelEntry>& model_registry() {
  static const std::vector<ModelEntry> models = {
      {"qwen2_moe", qwen2_moe::make_qwen2_moe},
      {"qwen3_moe", qwen2_moe::make_qwen3_moe},
      {"qwen2", qwen2::make_qwen2},
      {"llama", qwen2::make_llama},
  };
  return models;
}

std::shared_ptr<CausalLM> build_model(const ModelConfig& config, uint64_t seed) {
  for (const auto& entry : model_registry()) {
    if (entry.name != config.name) continue;
    auto model = entry.make(config, seed);
    for (const auto& item : model->named_parameters(/*recurse=*/true)) {
      try {
        model->param_role(item.key());
      } catch (const std::invalid_argument& e) {
        throw std::logic_error(std::string(e.what()) + " (the model must assign every role)");
      }
    }
    return model;
  }
  std::string known;
  for (const auto& entry : model_registry()) known += (known.empty() ? "" : ", ") + entry.name;
  throw ConfigError(ConfigKey{"model.name"},
                    "unknown model '" + config.name + "' (known: " + known + ")");
}

std::vector<std::string> registered_model_names() {
  std::vector<std::string> names;
  for (const auto& entry : model_registry()) names.push_back(entry.name);
  return names;
}

}  // namespace mixtrain
