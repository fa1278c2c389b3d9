#include "mixtrain/optim/loss_scaler.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "mixtrain/core/host_sync.h"
#include "mixtrain/core/logging.h"

namespace mixtrain {

DynamicLossScaler::DynamicLossScaler(DynamicLossScalerOptions options)
    : options_(options), scale_(options.initial_scale) {
  if (!(options_.initial_scale > 0) || !(options_.min_scale > 0))
    throw std::invalid_argument("loss scaler: initial_scale and min_scale must be > 0");
  if (!(options_.growth_factor > 1))
    throw std::invalid_argument("loss scaler: growth_factor must be > 1");
  if (!(options_.backoff_factor > 0 && options_.backoff_factor < 1))
    throw std::invalid_argument("loss scaler: backoff_factor must be in (0, 1)");
  if (options_.growth_interval < 1)
    throw std::invalid_argument("loss scaler: growth_interval must be >= 1");
}

bool DynamicLossScaler::unscale_and_check(const std::vector<at::Tensor>& grads) const {
  return read_int64(unscale_and_flag(grads), "loss scaler: found inf") != 0;
}

at::Tensor DynamicLossScaler::unscale_and_flag(const std::vector<at::Tensor>& grads) const {
  const double inv_scale = 1.0 / scale_;
  std::vector<at::Tensor> defined;
  for (const auto& grad : grads) {
    if (grad.defined()) defined.push_back(grad);
  }
  if (defined.empty()) return at::zeros({1}, at::kLong);
  const c10::Device device = defined.front().device();
  bool one_cuda_device = device.is_cuda();
  for (const auto& grad : defined) {
    one_cuda_device = one_cuda_device && grad.device() == device &&
                      at::isFloatingType(grad.scalar_type()) && grad.scalar_type() != at::kDouble;
  }
  if (one_cuda_device) {
    // grad * float(1 / scale) in float, as mul_ by the double scalar computes it.
    const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
    at::Tensor found = at::zeros({1}, options);
    at::_amp_foreach_non_finite_check_and_unscale_(defined, found,
                                                   at::full({1}, inv_scale, options));
    return (found > 0).to(at::kLong);
  }
  // One flag on the grads' device, read (if at all) once. Every grad is unscaled even after an
  // overflow: the grads stay consistent for a caller that inspects them, and the step is
  // skipped anyway.
  at::Tensor all_finite;
  for (const auto& grad : defined) {
    grad.mul_(inv_scale);
    const at::Tensor finite = at::isfinite(grad).all();
    all_finite = all_finite.defined() ? all_finite.logical_and(finite) : finite;
  }
  return all_finite.logical_not().to(at::kLong).reshape({1});
}

void DynamicLossScaler::update(bool found_inf) {
  if (found_inf) {
    const double old_scale = scale_;
    scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
    growth_tracker_ = 0;
    ++skipped_steps_;
    std::ostringstream message;
    message << "float16 loss scaling: inf/nan in the gradients, step skipped (" << skipped_steps_
            << " skipped so far); loss scale " << old_scale << " -> " << scale_;
    log_warn(message.str());
    return;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
}

void DynamicLossScaler::restore(double scale, int64_t growth_tracker, int64_t skipped_steps) {
  if (!(scale > 0)) throw std::invalid_argument("loss scaler: restored scale must be > 0");
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  skipped_steps_ = skipped_steps;
}

}  // namespace mixtrain
