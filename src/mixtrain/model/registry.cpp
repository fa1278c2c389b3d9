#include "mixtrain/model/registry.h"

#include <functional>
#include <utility>

#include "mixtrain/core/error.h"
#include "mixtrain/model/qwen2_moe.h"

namespace mixtrain {
namespace {

using Factory = std::function<std::shared_ptr<CausalLM>(const ModelConfig&, uint64_t)>;

const std::vector<std::pair<std::string, Factory>>& registry() {
  static const std::vector<std::pair<std::string, Factory>> models = {
      {"qwen2_moe", qwen2_moe::make_qwen2_moe},
  };
  return models;
}

}  // namespace

std::shared_ptr<CausalLM> build_model(const ModelConfig& config, uint64_t seed) {
  for (const auto& [name, factory] : registry()) {
    if (name == config.name) return factory(config, seed);
  }
  std::string known;
  for (const auto& entry : registry()) known += (known.empty() ? "" : ", ") + entry.first;
  throw ConfigError("model.name: unknown model '" + config.name + "' (known: " + known + ")");
}

std::vector<std::string> registered_model_names() {
  std::vector<std::string> names;
  for (const auto& entry : registry()) names.push_back(entry.first);
  return names;
}

}  // namespace mixtrain
