#include "mixtrain/optim/mixed_precision_optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/host_sync.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/core/text.h"

namespace mixtrain {
namespace {

// main_grad += param.grad (float32), then param.grad = undefined: run by autograd right after
// it accumulated the param's gradient (torch's register_post_accumulate_grad_hook).
class MainGradHook : public torch::autograd::PostAccumulateGradHook {
 public:
  MainGradHook(TrainingOptimizer* optimizer, std::string name)
      : optimizer_(optimizer), name_(std::move(name)) {}
  void operator()(const torch::autograd::Variable& param) override {
    if (!param.grad().defined()) return;
    c10::NoGradGuard no_grad;
    optimizer_->accumulate_main_grad(name_, param.grad());
    param.mutable_grad().reset();
  }

 private:
  TrainingOptimizer* optimizer_;
  std::string name_;
};

}  // namespace

MixedPrecisionOptimizer::MixedPrecisionOptimizer(std::unique_ptr<ChainedOptimizer> chained,
                                                 DynamicLossScalerOptions scaler_options)
    : chained_(std::move(chained)) {
  if (!chained_) throw std::invalid_argument("MixedPrecisionOptimizer: null ChainedOptimizer");
  // Check everything before the first replacement, so an error leaves the chain intact.
  bool any_float16 = false;
  for (const auto& name : chained_->names()) {
    const at::Tensor& model = chained_->model_param(name);
    const c10::ScalarType dtype = model.scalar_type();
    if (!is_low_precision(dtype) && dtype != at::kFloat)
      throw std::invalid_argument("MixedPrecisionOptimizer: parameter '" + name + "' has dtype " +
                                  dtype_name(dtype) +
                                  "; only float32, bfloat16 and float16 parameters are supported");
    if (!chained_->optimizer_param(name).is_same(model))
      throw std::invalid_argument("MixedPrecisionOptimizer: parameter '" + name +
                                  "' was already replaced in its leaf group");
    any_float16 = any_float16 || dtype == at::kHalf;
  }

  NamedTensors replacements;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (main, model)
  for (const auto& leaf : chained_->leaves()) {
    for (const auto& group : leaf->param_groups()) {
      std::vector<at::Tensor> float16_group, fp32_from_float16_group, fp32_from_fp32_group;
      for (const auto& model : group.params()) {
        const std::string& name = chained_->name_of(model);
        if (is_low_precision(model.scalar_type())) {
          at::Tensor main = model.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
          main.set_requires_grad(model.requires_grad());
          float16_group.push_back(model);
          fp32_from_float16_group.push_back(main);
          replacements.emplace_back(name, main);
          copy_back.emplace_back(main, model);
          low_precision_names_.push_back(name);
        } else {
          fp32_from_fp32_group.push_back(model);  // its own main param: no copy
          fp32_names_.push_back(name);
        }
      }
      float16_groups_.push_back(std::move(float16_group));
      fp32_from_float16_groups_.push_back(std::move(fp32_from_float16_group));
      fp32_from_fp32_groups_.push_back(std::move(fp32_from_fp32_group));
    }
  }
  chained_->replace_parameters(replacements);
  for (const auto& [main, model] : copy_back) {
    chained_->leaf_of(chained_->name_of(main)).set_copy_back(main, model);
  }
  if (any_float16) scaler_ = std::make_unique<DynamicLossScaler>(scaler_options);
}

const at::Tensor& MixedPrecisionOptimizer::main_param(const std::string& name) const {
  return chained_->optimizer_param(name);
}

bool MixedPrecisionOptimizer::is_own_main_param(const std::string& name) const {
  return chained_->optimizer_param(name).is_same(chained_->model_param(name));
}

void MixedPrecisionOptimizer::reload_model_params() {
  c10::NoGradGuard no_grad;
  for (const auto& name : low_precision_names_) {
    chained_->optimizer_param(name).copy_(chained_->model_param(name));
  }
}

at::Tensor& MixedPrecisionOptimizer::main_grad(const std::string& name) {
  return chained_->main_grad(name);
}

void MixedPrecisionOptimizer::accumulate_main_grad(const std::string& name,
                                                   const at::Tensor& grad) {
  chained_->accumulate_main_grad(name, grad);
}

void MixedPrecisionOptimizer::accumulate_model_grads_in_backward() {
  for (const auto& name : low_precision_names_) {
    const at::Tensor& model = chained_->model_param(name);
    if (!model.requires_grad()) continue;
    torch::autograd::impl::set_post_acc_grad_hooks(model,
                                                   std::make_unique<MainGradHook>(this, name));
  }
  grads_hooked_ = true;
}

MixedPrecisionOptimizer::~MixedPrecisionOptimizer() {
  if (!grads_hooked_) return;
  for (const auto& name : low_precision_names_) {
    torch::autograd::impl::post_acc_grad_hooks(chained_->model_param(name)).reset();
  }
}

void MixedPrecisionOptimizer::accumulate_model_grads() {
  c10::NoGradGuard no_grad;
  for (const auto& name : chained_->names()) {
    const at::Tensor& model = chained_->model_param(name);
    if (!model.grad().defined()) continue;
    // fp32 accumulation of the (exactly widened) low-precision grad, fp32-main-params §8.1.
    chained_->accumulate_main_grad(name, model.grad());
    model.mutable_grad().reset();
  }
}

void MixedPrecisionOptimizer::prepare_grads() {
  for (const auto& name : low_precision_names_) {
    const at::Tensor& model = chained_->model_param(name);
    const at::Tensor& main = chained_->optimizer_param(name);
    at::Tensor grad = chained_->main_grad_if_defined(name);
    if (!grad.defined()) grad = model.grad();
    // A float32 main_grad is used as is (no copy, no op); a low-precision .grad is widened.
    main.mutable_grad() =
        !grad.defined() || grad.scalar_type() == at::kFloat ? grad : grad.to(at::kFloat);
    model.mutable_grad().reset();
  }
  for (const auto& name : fp32_names_) {
    at::Tensor main_grad = chained_->main_grad_if_defined(name);
    if (main_grad.defined()) chained_->model_param(name).mutable_grad() = main_grad;
  }
  found_inf_ = false;
  if (scaler_) {
    // Every rank skips the same steps: an overflow in one shard is every holder's. The flag is
    // reduced over the groups on the grads' device and read once: the step's one host read in
    // float16 (whether to step is the host's decision).
    const at::Tensor flag =
        chained_->any_piece_holder(scaler_->unscale_and_flag(grads_for_clipping()));
    found_inf_ = read_int64(flag, "loss scaler: found inf") > 0;
    scaler_->update(found_inf_);
  }
}

std::vector<at::Tensor> MixedPrecisionOptimizer::grads_for_clipping() {
  return chained_->grads_for_clipping();  // the optimizer params are the main params
}

bool MixedPrecisionOptimizer::step_with_ready_grads() {
  if (found_inf_) {
    found_inf_ = false;
    return false;
  }
  // The leaves write each low-precision model param from its main param in their pass.
  return chained_->step_with_ready_grads();
}

void MixedPrecisionOptimizer::zero_grad() {
  chained_->zero_grad();  // main.grad, model.grad and main_grad
}

NamedTensors MixedPrecisionOptimizer::state_dict() const {
  NamedTensors state = chained_->state_dict();
  for (const auto& name : low_precision_names_) {
    state.emplace_back(kMainParamPrefix + name, chained_->optimizer_param(name).detach());
  }
  return state;
}

std::vector<std::string> MixedPrecisionOptimizer::check_state_dict(
    const NamedTensors& state) const {
  const std::string main_prefix = kMainParamPrefix;
  const std::unordered_set<std::string> low_precision(low_precision_names_.begin(),
                                                      low_precision_names_.end());
  std::vector<std::string> problems;
  NamedTensors leaf_state;
  std::set<std::string> mains;
  for (const auto& [key, tensor] : state) {
    if (key.compare(0, main_prefix.size(), main_prefix) != 0) {
      leaf_state.emplace_back(key, tensor);
      continue;
    }
    const std::string name = key.substr(main_prefix.size());
    if (!low_precision.count(name)) {
      problems.push_back("unexpected key " + key +
                         (chained_->contains(name)
                              ? " ('" + name + "' is float32: it is its own main param)"
                              : " (no trainable parameter '" + name + "')"));
      continue;
    }
    if (!mains.insert(name).second) {
      problems.push_back("duplicate key " + key);
      continue;
    }
    if (!tensor.defined()) {
      problems.push_back(key + ": undefined tensor");
      continue;
    }
    const at::Tensor& main = chained_->optimizer_param(name);
    if (tensor.sizes() != main.sizes())
      problems.push_back(key + ": shape " + format_list(tensor.sizes()) + ", expected " +
                         format_list(main.sizes()));
    if (tensor.scalar_type() != at::kFloat)
      problems.push_back(key + ": dtype " + dtype_name(tensor.scalar_type()) +
                         ", expected float32");
  }
  if (!mains.empty() && mains.size() < low_precision_names_.size()) {
    // fp32-main-params §9.3 branch 3: a partial set is damaged data, never silently completed.
    std::string missing;
    for (const auto& name : low_precision_names_) {
      if (!mains.count(name)) missing += (missing.empty() ? "" : ", ") + name;
    }
    problems.push_back("checkpoint has " + std::to_string(mains.size()) + " of " +
                       std::to_string(low_precision_names_.size()) + " " + main_prefix +
                       "* main params; missing: " + missing);
  }
  std::vector<std::string> leaf_problems = chained_->check_state_dict(leaf_state);
  problems.insert(problems.end(), leaf_problems.begin(), leaf_problems.end());
  return problems;
}

void MixedPrecisionOptimizer::load_state_dict(const NamedTensors& state) {
  // fp32-main-params §9.2: create the leaves' lazy state to check against. The probe step must
  // not write the model params (they may already hold a loaded checkpoint that differs from the
  // main params), so copy-back of the stepped params goes to scratch tensors meanwhile.
  std::vector<std::pair<at::Tensor, at::Tensor>> redirected;  // (main, model)
  for (const auto& name : low_precision_names_) {
    const at::Tensor& main = chained_->optimizer_param(name);
    LeafOptimizer& leaf = chained_->leaf_of(name);
    if (!leaf.export_state(main).empty()) continue;
    const at::Tensor& model = chained_->model_param(name);
    leaf.set_copy_back(main, at::empty_like(model));
    redirected.emplace_back(main, model);
  }
  auto restore_copy_back = [&] {
    for (const auto& [main, model] : redirected) {
      chained_->leaf_of(chained_->name_of(main)).set_copy_back(main, model);
    }
  };
  ChainedOptimizer::StateInitialization created;
  try {
    created = chained_->initialize_state();
  } catch (...) {
    restore_copy_back();
    throw;
  }
  restore_copy_back();

  // Plan: every problem, nothing changed but the created state, which goes again.
  const std::vector<std::string> problems = check_state_dict(state);
  if (!problems.empty()) {
    chained_->undo_initialize_state(created);
    throw std::invalid_argument(format_load_problems("optimizer load_state_dict", problems));
  }

  // Apply (checked: cannot fail on data).
  const std::string main_prefix = kMainParamPrefix;
  NamedTensors leaf_state;
  std::vector<std::pair<std::string, at::Tensor>> mains;
  for (const auto& [key, tensor] : state) {
    if (key.compare(0, main_prefix.size(), main_prefix) != 0) {
      leaf_state.emplace_back(key, tensor);
    } else {
      mains.emplace_back(key.substr(main_prefix.size()), tensor);
    }
  }
  chained_->import_checked_state(leaf_state);
  if (mains.empty() && !low_precision_names_.empty()) {
    reload_model_params();
    log_warn("optimizer checkpoint has no " + main_prefix + "* main params: rebuilt " +
             std::to_string(low_precision_names_.size()) +
             " fp32 main params from the low-precision model params; the fp32 mantissa bits "
             "the low-precision model lost cannot be restored");
    return;
  }
  c10::NoGradGuard no_grad;
  for (const auto& [name, tensor] : mains) {
    chained_->optimizer_param(name).copy_(tensor);  // float32 -> float32: exact
  }
}

}  // namespace mixtrain
