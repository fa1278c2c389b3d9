// Swap optimizer (docs/architecture.md §9; the Muon feature's swap_optimizer / swap_merge_buckets):
// AdamW's exp_avg / exp_avg_sq and Muon's momentum_buffer live outside the memory the leaves
// compute in between steps and come in bucket by bucket while step() runs. Where they live is a
// tier (swap_tier.h): a file for CPU state (swap_file_tier.h), pinned host memory for device
// state (swap_pinned_tier.h). This class is the schedule, the same for both.
//
// The leaves (AdamW, SGD, Muon on every path) bracket each parameter's state use with
// acquire(param) / release(param) (LeafOptimizer::acquire_state). The floating state tensors of
// a parameter keep their TensorImpl, shape and dtype at all times; only their storage comes and
// goes (an empty storage while swapped out), so the leaves' state maps, shape checks and
// checkpoint keys never notice. A state tensor swapped out must not be read.
//
// Schedule: parameters are grouped in the order the leaves acquired them in the previous step
// (the order is the same every step): buckets of `bucket_bytes` of state, groups of
// `merge_buckets` buckets. During a step, while group g is in use, group g+1 is read ahead and,
// once the leaves moved past g, g is written back and dropped, in that order, so at most two
// groups are in memory. Parameters acquired out of order are brought back in at once (correct,
// just slower); parameters whose state appears during a step (first step, or initialize_state)
// are written out as soon as a group's worth of them exists. Values go through the tier bit for
// bit: swap on and off train identically.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mixtrain/optim/swap_tier.h"

namespace mixtrain {

class LeafOptimizer;

class StateSwap {
 public:
  // The tier for state on `device`: the file `path` for the CPU (created here: a UserError
  // naming it when it cannot be), pinned host memory for another device (`path` unused).
  StateSwap(const std::string& path, int64_t bucket_bytes, int64_t merge_buckets,
            c10::Device device = c10::Device(c10::kCPU));
  StateSwap(std::unique_ptr<SwapTier> tier, int64_t bucket_bytes, int64_t merge_buckets);
  ~StateSwap();
  StateSwap(const StateSwap&) = delete;
  StateSwap& operator=(const StateSwap&) = delete;

  // Around every leaf step (ChainedOptimizer::step_with_ready_grads, initialize_state).
  void begin_step();
  void end_step();  // starts writing back everything in memory; rethrows transfer errors
  // The leaves, around their use of one parameter's state.
  void acquire(LeafOptimizer& leaf, const at::Tensor& param);
  void release(LeafOptimizer& leaf, const at::Tensor& param);

  // Outside steps. The state of `param` as leaf.export_state names it, with swapped-out tensors
  // read from the tier into new tensors (the live state is not touched).
  std::vector<std::pair<std::string, at::Tensor>> read_state(LeafOptimizer& leaf,
                                                             const at::Tensor& param);
  // After state was imported into the leaves (checkpoint load): writes every listed
  // parameter's state to the tier and drops it from memory.
  void store(const std::vector<std::pair<LeafOptimizer*, at::Tensor>>& params);

  // Where the state lives: the file's path, or the pinned memory and its device.
  std::string path() const { return tier_->where(); }
  int64_t groups() const { return static_cast<int64_t>(groups_.size()); }
  int64_t group_bytes(int64_t group) const;  // state bytes of its members
  // Bytes of state in the leaves' memory (device memory for device state) and their peak, as
  // SwapTier counts them: 0 between steps; in a step about two groups.
  int64_t resident_bytes() const { return tier_->resident_bytes(); }
  int64_t peak_resident_bytes() const { return tier_->peak_resident_bytes(); }
  void reset_peak_resident_bytes() { tier_->reset_peak_resident_bytes(); }
  const SwapTier& tier() const { return *tier_; }

 private:
  struct Entry {
    LeafOptimizer* leaf = nullptr;
    at::Tensor param;
    int64_t bytes = 0;    // of all its swapped tensors
    bool stored = false;  // has a copy in the tier
    int64_t group = -1;
  };
  struct Group {
    std::vector<const void*> members;  // Entry keys, acquire order
    bool in = false;                   // read (or being read), not yet written back
  };
  // The live floating state tensors of a parameter.
  static std::vector<at::Tensor> swappable(LeafOptimizer& leaf, const at::Tensor& param);
  Entry& register_param(LeafOptimizer& leaf, const at::Tensor& param);
  void read_group(int64_t group);
  void write_group(int64_t group);
  void write_entries(const std::vector<const void*>& keys);
  void rebuild_groups(const std::vector<const void*>& order);

  std::unique_ptr<SwapTier> tier_;
  int64_t bucket_bytes_, merge_buckets_;
  std::unordered_map<const void*, Entry> entries_;  // by optimizer-param TensorImpl
  std::vector<Group> groups_;
  // This step: acquire order, the group in use, state that appeared (not yet in the tier).
  std::vector<const void*> order_;
  int64_t current_group_ = -1;
  std::vector<const void*> fresh_;
  int64_t fresh_bytes_ = 0;
};

}  // namespace mixtrain
