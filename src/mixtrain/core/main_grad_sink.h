// Where a parallel layout delivers reduced float32 gradients when the optimizer keeps fp32 main
// grads (fp32-main-params §8.1): distributed/ hands each parameter's reduced gradient to this
// interface and knows nothing else of the optimizer (optim/training_optimizer.h implements it).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace mixtrain {

class MainGradSink {
 public:
  virtual ~MainGradSink() = default;
  // main_grad(name) += grad, in float32; the step's first call writes 0 + grad.
  virtual void accumulate_main_grad(const std::string& name, const at::Tensor& grad) = 0;
};

}  // namespace mixtrain
