#include "mixtrain/trainer/model_state_hook.h"

namespace mixtrain {

ModelStateHook::ModelStateHook(CausalLM& model, const DeviceMesh& mesh)
    : model_(model), mesh_(mesh) {}

void ModelStateHook::before_forward(int64_t /*step*/) {
  model_.set_collect_state_statistics(true);
}

void ModelStateHook::after_update(StepResult& /*result*/) {
  model_.update_model_state([this](torch::Tensor& t) {
    mesh_.dp_shard_group->all_reduce_sum(t);
    mesh_.dp_replicate_group->all_reduce_sum(t);
  });
}

void ModelStateHook::before_eval() {
  model_.set_collect_state_statistics(false);
}

void ModelStateHook::after_eval() {
  model_.set_collect_state_statistics(true);
}

}  // namespace mixtrain
