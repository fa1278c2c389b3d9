// optim-replay (docs/architecture.md §10): runs the configured optimizer stack on given parameters
// with given float32 gradients, so anyone can check our numerics against another framework.
//
//   params file: one tensor per parameter, keyed by its fully qualified name, in its model
//                dtype (float32, bfloat16 or float16; dtypes may differ per tensor).
//   grads file:  float32 gradients keyed "step.<k>.<name>", k = 1..steps, every parameter at
//                every step, same shape as the parameter.
//   out file:    "model.<name>" (model dtype), the optimizer state under the checkpoint keys
//                ("optimizer.state.<name>.<exp_avg|exp_avg_sq|momentum_buffer|step|
//                normuon_v>") and, with fp32_main_params, "optimizer._mixed_precision_optimizer.
//                fp32_from_fp16_params.<name>" (float32, low-precision params only).
//
// Each step is the trainer's: the gradient arrives as the parameter's float32 main_grad (as
// FSDP delivers it) with fp32_main_params, else as its .grad in the parameter's dtype; then
// prepare_grads, clipping by train.max_grad_norm, step, zero_grad. The LR is constant unless
// the config sets a train.lr_scheduler key, in which case the schedule runs over the replay's
// steps. Every input is validated before the first step; the output is written atomically at
// the end, so an error leaves nothing behind.
#pragma once

#include <cstdint>
#include <string>

#include "mixtrain/config/load.h"

namespace mixtrain {

struct ReplayPaths {
  std::string params;
  std::string grads;
  std::string out;
};

// Returns the number of steps replayed. Throws UserError (naming the file and the key) for
// bad inputs, ConfigError for configs the stack refuses.
int64_t run_optim_replay(const ResolvedConfig& resolved, const ReplayPaths& paths);

}  // namespace mixtrain
