// Where the time of a training step goes (train.profile; issue 7 part 3).
//
// The trainer times its phases with a steady clock on every step (a few clock reads: free
// whether or not train.profile is on); with train.profile, rank 0 writes the split to
// metrics.jsonl and logs the average of the last train.log_every steps in one line:
//
//   profile steps 3-4: 0.512 s/step = forward 0.120 (23%) | backward 0.250 (49%; gradient
//   reduce 0.030) | clip 0.010 (2%) | optimizer 0.100 (20%) | checkpoint 0.000 (0%) | other
//   0.032 (6%) | 8.0k tok/s
//
// Phases (wall seconds of this rank's training thread; other ranks are not waited for, but a
// phase that contains a collective includes the wait for the slowest rank):
//   forward     model forward and the loss, summed over the micro-batches
//   backward    loss.backward() and the per-micro-batch grad accumulation: includes FSDP's
//               gradient reduce-scatter, HSDP/DDP all-reduce and the expert-gradient all-reduce
//               (they run inside backward), its parameter re-gathers and expert all_to_alls
//   reduce      of backward: the seconds spent inside reduce_scatter and all_reduce calls
//               during backward, from this thread's communication counters (core/collectives.h)
//   clip        the global gradient-norm computation and clipping (its all_reduce included)
//   optimizer   prepare_grads, the optimizer step (distributed Muon's all_to_alls included),
//               zero_grad
//   checkpoint  save_checkpoint on the training thread (with checkpoint.async: the copy of the
//               tensors and the join of the previous save, not the background write)
//   other       the rest of the step: reading the batch, the loss all-reduce, the
//               any-rank-interrupted check
//   step        all of it: from the start of the loop iteration to the end of its checkpoint
//               save (the metrics line and the log are written after it)
// The log line's tokens/s is the global batch's tokens over this step time (checkpoints
// included, unlike metrics.jsonl's tokens_per_s, which times the training step alone).
// On a device the phases are timed after a device synchronisation at the end of each phase
// (only with train.profile: kernels run asynchronously, so the host clock alone would charge
// them to whichever later phase waits), and the line ends with "| peak device memory X GiB",
// the most the device's allocator held in any of the steps.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/op_counter.h"

namespace mixtrain {

struct StepTimes {
  double forward_s = 0.0;
  double backward_s = 0.0;
  double reduce_s = 0.0;  // part of backward_s
  double clip_s = 0.0;
  double optimizer_s = 0.0;
  double checkpoint_s = 0.0;
  double step_s = 0.0;  // the whole step; >= the sum of the phases (reduce is within backward)
  // On a device (train.device: cuda): the most bytes its caching allocator had allocated during
  // the step; 0 on the CPU. Summing keeps the maximum; scaling leaves it.
  int64_t peak_device_bytes = 0;

  // step_s minus the phases (never negative: clock reads of different phases may overlap by
  // nanoseconds).
  double other_s() const;
  StepTimes& operator+=(const StepTimes& other);
  StepTimes& operator*=(double factor);  // every field
};

// What one step dispatched and allocated, by phase (train.count_ops; core/op_counter.h): the
// same phases as StepTimes (the gradient reduce is inside backward), `step` the whole iteration,
// `other` the bookkeeping between the phases (the batch, the loss read, the interrupt check).
// collectives: the communication calls of the step (core/collectives.h; 0 on one process).
struct StepOps {
  OpCounts forward, backward, clip, optimizer, checkpoint, step;
  int64_t collectives = 0;

  OpCounts other() const;  // step minus the phases
  // (name, counts) of forward, backward, clip, optimizer, checkpoint and other, in that order:
  // the log line's and metrics.jsonl's phases.
  std::vector<std::pair<const char*, OpCounts>> phases() const;
  std::string format(int64_t step_number) const;  // the log line (trainer/step_log.h)
};

// Sums the steps between two profile log lines.
class StepProfile {
 public:
  void add(int64_t step, const StepTimes& times, double tokens);
  bool empty() const { return steps_ == 0; }
  // The average step of what was added, as in the header comment; "" when empty.
  std::string format() const;
  void clear();

 private:
  StepTimes sum_;
  int64_t steps_ = 0;
  int64_t first_step_ = 0;
  int64_t last_step_ = 0;
  double tokens_ = 0.0;
};

}  // namespace mixtrain
