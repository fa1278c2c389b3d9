// Where the swap optimizer's state lives between steps (state_swap.h keeps the schedule: which
// parameters' state comes in or goes out, when). A tier moves the floating state tensors of
// parameters between their home and the memory the leaves compute in, storage only: a tensor's
// TensorImpl, shape and dtype stay, its storage is empty while it is out.
//
// Two tiers: SwapFileTier (swap_file_tier.h, CPU tensors: a file, an I/O thread) and
// PinnedHostSwapTier (swap_pinned_tier.h, device tensors: pinned host memory, a side stream).
// Every call comes from the training thread; a tier may finish its transfers on its own thread or
// stream, in the order they were started.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain {

// One parameter's live state tensors, in export_state order (floating, dim >= 1, contiguous).
struct SwapItem {
  const void* key = nullptr;  // the optimizer parameter's TensorImpl
  std::vector<at::Tensor> tensors;
};

class SwapTier {
 public:
  virtual ~SwapTier() = default;

  // For messages: the file, or the memory and device.
  virtual std::string where() const = 0;
  // Once per parameter, before its first write: a home for its tensors. Throws
  // std::logic_error when they are not in the memory this tier swaps (a CPU tensor given to a
  // device tier, or the reverse).
  virtual void place(const SwapItem& item) = 0;

  virtual void begin_step() = 0;
  // Starts bringing the swapped-out tensors of `items` in from their homes (a tensor that is in
  // memory is newer and stays). The leaves may use them after wait_usable(group).
  virtual void read(int64_t group, std::vector<SwapItem> items) = 0;
  // Starts copying the in-memory tensors of `items` home and drops their storage; the memory is
  // reused only once the copy is done. Ordered after every read and write started before.
  virtual void write(std::vector<SwapItem> items) = 0;
  // Before the leaves use group `group` (after read(group)): its tensors hold their values for
  // the leaves' work. Rethrows a transfer error.
  virtual void wait_usable(int64_t group) = 0;
  // In a step, before another group's worth of new state is written: bounds what is in flight.
  virtual void throttle() = 0;
  // At the end of a step, after the last writes were started.
  virtual void finish_step() = 0;
  // Outside steps: every transfer done, the homes readable and writable from the host.
  // Rethrows a transfer error.
  virtual void drain() = 0;
  // Outside steps, after drain(): a new tensor like `like` (its device) holding the home copy of
  // tensor `index` of parameter `key`.
  virtual at::Tensor read_home(const void* key, size_t index, const at::Tensor& like) = 0;

  // Bytes of state tensors in the memory the leaves compute in (host memory for the file tier,
  // device memory for the device tier), as far as the swap knows: what the tier brought in and
  // what the schedule saw appear, less what was dropped. Peak since the last reset.
  int64_t resident_bytes() const { return resident_.load(); }
  int64_t peak_resident_bytes() const { return peak_.load(); }
  void reset_peak_resident_bytes() { peak_.store(resident_.load()); }
  // Thread-safe (the file tier's I/O thread counts too).
  void count_resident(int64_t delta);
  void set_resident(int64_t bytes);

 private:
  std::atomic<int64_t> resident_{0}, peak_{0};
};

// Shared by the tiers.
inline int64_t state_nbytes(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}
// Whether `t` has its values in memory (an empty tensor always has).
bool state_in_memory(const at::Tensor& t);
// Gives `t` the storage of `data` (same size and dtype), keeping its TensorImpl.
void adopt_state_storage(const at::Tensor& t, const at::Tensor& data);
// Gives `t` an empty storage of its device and dtype, keeping its TensorImpl.
void empty_state_storage(const at::Tensor& t);

}  // namespace mixtrain
