#include "mixtrain/optim/swap_pinned_tier.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>

#include <stdexcept>
#include <utility>

namespace mixtrain {
namespace {

constexpr int64_t kSlabBytes = int64_t{64} << 20;  // least pinned allocation
constexpr int64_t kAlign = 512;                    // of each home in a slab: copy-friendly

int64_t round_up(int64_t n, int64_t to) {
  return (n + to - 1) / to * to;
}
c10::Device with_index(c10::Device device) {
  if (device.is_cpu()) {
    throw std::logic_error("swap optimizer: the pinned host tier swaps device tensors, not CPU");
  }
  if (device.has_index()) return device;
  return c10::Device(device.type(), c10::impl::VirtualGuardImpl(device.type()).getDevice().index());
}
int64_t power_of_two_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

PinnedHostSwapTier::PinnedHostSwapTier(c10::Device device)
    : device_(with_index(device)),
      guard_(device.type()),
      side_(guard_.getStreamFromGlobalPool(device_, /*isHighPriority=*/false)) {}

PinnedHostSwapTier::~PinnedHostSwapTier() {
  try {
    guard_.synchronizeStream(side_);
  } catch (...) {  // a destructor must not throw (e.g. the driver is shutting down)
  }
}

std::string PinnedHostSwapTier::where() const {
  return "pinned host memory (state of " + device_.str() + ")";
}

int64_t PinnedHostSwapTier::pinned_bytes() const {
  int64_t bytes = 0;
  for (const auto& slab : slabs_) bytes += slab.numel();
  return bytes;
}

at::Tensor PinnedHostSwapTier::pinned_home(const at::Tensor& like) {
  const int64_t bytes = state_nbytes(like);
  const int64_t need = round_up(std::max<int64_t>(bytes, 1), kAlign);
  size_t slab = 0;  // the first with room
  while (slab < slabs_.size() && slab_used_[slab] + need > slabs_[slab].numel()) ++slab;
  if (slab == slabs_.size()) {
    // The allocator rounds a pinned request up to a power of two: ask for that and use it all.
    const int64_t size = power_of_two_at_least(std::max(kSlabBytes, need));
    slabs_.push_back(at::empty({size}, at::TensorOptions().dtype(at::kByte).pinned_memory(true)));
    slab_used_.push_back(0);
  }
  at::Tensor home =
      slabs_[slab].narrow(0, slab_used_[slab], bytes).view(like.scalar_type()).view(like.sizes());
  slab_used_[slab] += need;
  return home;
}

void PinnedHostSwapTier::place(const SwapItem& item) {
  std::vector<at::Tensor> homes;
  for (const auto& t : item.tensors) {
    if (t.device() != device_) {
      throw std::logic_error("swap optimizer: the device tier for " + device_.str() +
                             " was given state on " + t.device().str());
    }
    homes.push_back(pinned_home(t));
  }
  homes_[item.key] = std::move(homes);
}

void PinnedHostSwapTier::read(int64_t group, std::vector<SwapItem> items) {
  // Allocated on the side stream: the caching allocator gives these blocks back only to later
  // side-stream work, which is ordered after this group's write-back.
  const c10::StreamGuard on_side(side_);
  for (const auto& item : items) {
    const std::vector<at::Tensor>& homes = homes_.at(item.key);
    for (size_t i = 0; i < item.tensors.size(); ++i) {
      const at::Tensor& t = item.tensors[i];
      if (state_in_memory(t)) continue;  // imported or created since: the live value is newer
      at::Tensor data = at::empty(t.sizes(), t.options());
      data.copy_(homes[i], /*non_blocking=*/true);
      adopt_state_storage(t, data);
      count_resident(state_nbytes(t));
    }
  }
  c10::Event ready(device_.type());
  ready.record(side_);
  ready_.insert_or_assign(group, std::move(ready));
}

void PinnedHostSwapTier::wait_usable(int64_t group) {
  auto it = ready_.find(group);
  if (it == ready_.end()) {
    throw std::logic_error("swap optimizer: group " + std::to_string(group) +
                           " used before it was read");
  }
  it->second.block(compute_stream());
}

void PinnedHostSwapTier::write(std::vector<SwapItem> items) {
  c10::Event used(device_.type());
  used.record(compute_stream());  // after every op the leaves queued on these tensors
  used.block(side_);
  const c10::StreamGuard on_side(side_);
  for (const auto& item : items) {
    const std::vector<at::Tensor>& homes = homes_.at(item.key);
    for (size_t i = 0; i < item.tensors.size(); ++i) {
      const at::Tensor& t = item.tensors[i];
      if (!state_in_memory(t)) continue;
      if (t.numel() > 0) {
        homes[i].copy_(t, /*non_blocking=*/true);
        // State created on the compute stream: not reused there before this copy is done.
        guard_.recordDataPtrOnStream(t.storage().data_ptr(), side_);
      }
      count_resident(-state_nbytes(t));
      empty_state_storage(t);
    }
  }
}

void PinnedHostSwapTier::drain() {
  guard_.synchronizeStream(side_);
}

at::Tensor PinnedHostSwapTier::read_home(const void* key, size_t index, const at::Tensor& like) {
  at::Tensor data = at::empty(like.sizes(), like.options());
  data.copy_(homes_.at(key).at(index));  // blocking: the caller reads it at once
  return data;
}

}  // namespace mixtrain
