#include "mixtrain/trainer/optim_replay.h"

#include <ATen/ATen.h>

#include <map>
#include <set>
#include <utility>
#include <vector>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/core/safetensors.h"
#include "mixtrain/optim/build_optimizer.h"
#include "mixtrain/optim/grad_clip.h"
#include "mixtrain/optim/lr_schedule.h"

namespace mixtrain {
namespace {

using GradsByStep = std::vector<std::map<std::string, at::Tensor>>;  // [k-1][name]

std::string shape_text(const at::Tensor& t) {
  std::string out = "[";
  for (int64_t i = 0; i < t.dim(); ++i) out += (i ? ", " : "") + std::to_string(t.size(i));
  return out + "]";
}

NamedTensors read_params(const std::string& path) {
  NamedTensors params = read_safetensors(path).tensors;
  if (params.empty()) throw UserError(path + ": no parameters in the file");
  for (auto& [name, tensor] : params) {
    const auto dtype = tensor.scalar_type();
    if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) {
      throw UserError(path + ": " + name + ": dtype " + dtype_name(dtype) +
                      " is not a parameter dtype (float32, bfloat16 or float16)");
    }
    tensor.requires_grad_(true);
  }
  return params;
}

// Checks every "step.<k>.<name>" key against the parameters before anything runs.
GradsByStep read_grads(const std::string& path, const NamedTensors& params) {
  std::map<std::string, at::Tensor> param_by_name(params.begin(), params.end());
  std::map<int64_t, std::map<std::string, at::Tensor>> by_step;
  for (auto& [key, grad] : read_safetensors(path).tensors) {
    const size_t dot = key.find('.', 5);
    int64_t step = 0;
    bool well_formed = key.rfind("step.", 0) == 0 && dot != std::string::npos && dot > 5;
    if (well_formed) {
      const std::string digits = key.substr(5, dot - 5);
      well_formed = digits.find_first_not_of("0123456789") == std::string::npos &&
                    digits.size() < 10 && digits[0] != '0';
      if (well_formed) step = std::stoll(digits);
    }
    if (!well_formed)
      throw UserError(path + ": " + key + ": expected a key step.<k>.<name>, k >= 1");
    const std::string name = key.substr(dot + 1);
    auto param = param_by_name.find(name);
    if (param == param_by_name.end()) {
      throw UserError(path + ": " + key + ": no parameter named " + name + " in the params file");
    }
    if (grad.scalar_type() != at::kFloat) {
      throw UserError(path + ": " + key + ": gradients must be float32, got " +
                      dtype_name(grad.scalar_type()));
    }
    if (!grad.sizes().equals(param->second.sizes())) {
      throw UserError(path + ": " + key + ": shape " + shape_text(grad) + " differs from the " +
                      "parameter's " + shape_text(param->second));
    }
    by_step[step][name] = grad;
  }
  if (by_step.empty()) throw UserError(path + ": no gradients in the file");
  GradsByStep grads;
  for (int64_t k = 1; k <= by_step.rbegin()->first; ++k) {
    auto it = by_step.find(k);
    if (it == by_step.end()) {
      throw UserError(path + ": step." + std::to_string(k) + ".*: step missing (steps must be 1.." +
                      std::to_string(by_step.rbegin()->first) + ")");
    }
    for (const auto& [name, param] : params) {
      if (!it->second.count(name)) {
        throw UserError(path + ": step." + std::to_string(k) + "." + name + ": gradient missing");
      }
    }
    grads.push_back(std::move(it->second));
  }
  return grads;
}

bool schedule_configured(const ResolvedConfig& resolved) {
  for (const auto& leaf : resolved.leaves) {
    if (leaf.key.rfind("train.lr_scheduler.", 0) == 0 && leaf.source != ValueSource::kDefault) {
      return true;
    }
  }
  return false;
}

}  // namespace

int64_t run_optim_replay(const ResolvedConfig& resolved, const ReplayPaths& paths) {
  const TrainerConfig& config = resolved.config;
  NamedTensors params = read_params(paths.params);
  GradsByStep grads = read_grads(paths.grads, params);
  const int64_t steps = static_cast<int64_t>(grads.size());
  log_info("optim-replay: " + std::to_string(params.size()) + " parameters, " +
           std::to_string(steps) + " steps");

  std::unique_ptr<TrainingOptimizer> optimizer = build_optimizer(params, config);
  const bool schedule = schedule_configured(resolved);
  LrSchedule lr_schedule(config.train.lr_scheduler, steps);
  for (int64_t k = 1; k <= steps; ++k) {
    optimizer->set_lr_factor(schedule ? lr_schedule.factor(k) : 1.0);
    // The given grads are true gradients; a float16 stack expects them as a loss-scaled
    // backward would deliver them (the scale is a power of two, so unscaling is exact).
    const double loss_scale = optimizer->loss_scale();
    for (auto& [name, param] : params) {
      const at::Tensor grad = grads[k - 1].at(name) * loss_scale;
      if (config.optimizer.fp32_main_params) {
        optimizer->main_grad(name).copy_(grad);
      } else {
        param.mutable_grad() = grad.to(param.scalar_type());
      }
    }
    optimizer->prepare_grads();
    clip_grad_norm(optimizer->grads_for_clipping(), config.train.max_grad_norm);
    if (!optimizer->step_with_ready_grads()) {
      log_warn("optim-replay: step " + std::to_string(k) + " skipped (non-finite gradients)");
    }
    optimizer->zero_grad();
  }

  NamedTensors out;
  for (const auto& [name, param] : params) out.emplace_back("model." + name, param.detach());
  for (const auto& entry : optimizer->state_dict()) out.push_back(entry);
  write_safetensors(paths.out, out);
  log_info("optim-replay: wrote " + paths.out);
  return steps;
}

}  // namespace mixtrain
