// Dynamic loss scaling for float16 models (Megatron's DynamicGradScaler without hysteresis;
// docs/architecture.md §6): float16 gradients of an unscaled loss underflow silently.
//
// The trainer multiplies the loss by scale(); the optimizer unscales the float32 main grads
// (unscale_and_check) and calls update(found_inf):
//   inf/nan: the step is skipped, scale *= backoff_factor (0.5, never below min_scale 1),
//            the clean-step counter restarts, a warning is logged and skipped_steps counts it;
//   clean:   after growth_interval (1000) consecutive clean steps, scale *= growth_factor (2).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace mixtrain {

struct DynamicLossScalerOptions {
  double initial_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;
  double min_scale = 1.0;
};

class DynamicLossScaler {
 public:
  // Throws std::invalid_argument for a non-positive scale, growth_factor <= 1,
  // backoff_factor outside (0, 1) or growth_interval < 1.
  explicit DynamicLossScaler(DynamicLossScalerOptions options = {});

  double scale() const { return scale_; }
  // Multiplies every defined grad in place by 1 / scale() and returns true when any element
  // of any of them is inf or nan (a host read of the flag below).
  bool unscale_and_check(const std::vector<at::Tensor>& grads) const;
  // The same without reading: int64 [1], 1 when any element is inf or nan, else 0, on the
  // grads' device (the CPU when none is defined). Grads all on one CUDA device take one
  // multi-tensor pass (ATen's _amp_foreach_non_finite_check_and_unscale_, the same products).
  at::Tensor unscale_and_flag(const std::vector<at::Tensor>& grads) const;
  void update(bool found_inf);

  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t growth_tracker() const { return growth_tracker_; }  // clean steps since last change
  // For checkpoints (non-tensor state).
  void restore(double scale, int64_t growth_tracker, int64_t skipped_steps);

 private:
  DynamicLossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace mixtrain
