// The swap optimizer's device tier (swap_tier.h), for state tensors on an accelerator (CUDA):
// between steps each parameter's state lives in pinned host memory; during a step it comes to the
// device and goes back on a side stream, so the copies overlap the leaves' work on the compute
// stream (the device's current stream when the schedule calls in).
//
//   read(g):   on the side stream, allocate the device tensors and copy host->device
//              (non_blocking, from pinned memory), then record ready[g];
//   wait_usable(g): the compute stream waits for ready[g] (no host wait);
//   write:     record an event on the compute stream (the leaves' last use of the tensors was
//              queued before it), the side stream waits for it and copies device->host into the
//              pinned homes; the device storage is released at once, but the caching allocator
//              hands the memory out again only after the copy (the storage's use on the side
//              stream is recorded: recordDataPtrOnStream), and a block allocated on the side
//              stream is only ever handed to later side-stream work.
//
// State created on the device in a step (the first) leaves a group's worth at a time without a
// wait; its memory is reused once its copy is done (before reporting out of memory the caching
// allocator waits for such pending copies).
//
// No host synchronisation in a step, end_step included: every access to the pinned homes in a
// step is a copy on the one side stream, so a read of the next step is ordered after the writes
// of this one. The host itself touches the homes only outside steps (drain: synchronizes the side
// stream; then read_home and the schedule's store). Device-generic: c10::Stream, c10::Event and
// c10::impl::VirtualGuardImpl, no CUDA header; pinned memory from at::empty(pinned_memory).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "mixtrain/optim/swap_tier.h"

namespace mixtrain {

class PinnedHostSwapTier final : public SwapTier {
 public:
  // `device`: where the state tensors are (not the CPU); the side stream comes from its pool.
  explicit PinnedHostSwapTier(c10::Device device);
  ~PinnedHostSwapTier() override;  // waits for the side stream: the copies use the pinned homes

  std::string where() const override;
  c10::Device device() const { return device_; }
  // Pinned host bytes held for the homes.
  int64_t pinned_bytes() const;

  void place(const SwapItem& item) override;
  void begin_step() override {}
  void read(int64_t group, std::vector<SwapItem> items) override;
  void write(std::vector<SwapItem> items) override;
  void wait_usable(int64_t group) override;
  void throttle() override {}     // device memory is freed at once, reused stream-ordered
  void finish_step() override {}  // see the header comment: nothing to wait for
  void drain() override;
  at::Tensor read_home(const void* key, size_t index, const at::Tensor& like) override;

 private:
  c10::Stream compute_stream() const { return guard_.getStream(device_); }
  at::Tensor pinned_home(const at::Tensor& like);

  c10::Device device_;
  c10::impl::VirtualGuardImpl guard_;
  c10::Stream side_;
  std::unordered_map<const void*, std::vector<at::Tensor>> homes_;  // pinned, per tensor, by key
  // Pinned slabs the homes are cut from (pinned allocations are costly and rounded up to a power
  // of two: one per parameter would waste up to half).
  std::vector<at::Tensor> slabs_;
  std::vector<int64_t> slab_used_;                 // bytes handed out of each slab (first fit)
  std::unordered_map<int64_t, c10::Event> ready_;  // by group: its last read's copies are done
};

}  // namespace mixtrain
