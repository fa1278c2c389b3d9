#include "mixtrain/optim/state_swap.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include "mixtrain/optim/leaf_optimizer.h"
#include "mixtrain/optim/swap_file_tier.h"
#include "mixtrain/optim/swap_pinned_tier.h"

namespace mixtrain {
namespace {

std::unique_ptr<SwapTier> tier_for(const std::string& path, c10::Device device) {
  if (device.is_cpu()) return std::make_unique<SwapFileTier>(path);
  return std::make_unique<PinnedHostSwapTier>(device);
}

int64_t bytes_in_memory(const std::vector<at::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (state_in_memory(t)) bytes += state_nbytes(t);
  }
  return bytes;
}

}  // namespace

StateSwap::StateSwap(const std::string& path, int64_t bucket_bytes, int64_t merge_buckets,
                     c10::Device device)
    : StateSwap(tier_for(path, device), bucket_bytes, merge_buckets) {}

StateSwap::StateSwap(std::unique_ptr<SwapTier> tier, int64_t bucket_bytes, int64_t merge_buckets)
    : tier_(std::move(tier)),
      bucket_bytes_(std::max<int64_t>(1, bucket_bytes)),
      merge_buckets_(std::max<int64_t>(1, merge_buckets)) {}

StateSwap::~StateSwap() = default;

std::vector<at::Tensor> StateSwap::swappable(LeafOptimizer& leaf, const at::Tensor& param) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : leaf.export_state(param)) {
    if (t.defined() && at::isFloatingType(t.scalar_type()) && t.dim() >= 1) out.push_back(t);
  }
  return out;
}

StateSwap::Entry& StateSwap::register_param(LeafOptimizer& leaf, const at::Tensor& param) {
  const void* key = param.unsafeGetTensorImpl();
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second;
  Entry e;
  e.leaf = &leaf;
  e.param = param;
  SwapItem item{key, swappable(leaf, param)};
  for (const auto& t : item.tensors) {
    if (!t.is_contiguous() || t.storage_offset() != 0) {
      throw std::logic_error("swap optimizer: " + leaf.kind() +
                             " state of a parameter is not a contiguous tensor of its own");
    }
    e.bytes += state_nbytes(t);
  }
  tier_->place(item);
  return entries_.emplace(key, std::move(e)).first->second;
}

int64_t StateSwap::group_bytes(int64_t group) const {
  int64_t bytes = 0;
  for (const void* key : groups_.at(group).members) bytes += entries_.at(key).bytes;
  return bytes;
}

void StateSwap::read_group(int64_t group) {
  std::vector<SwapItem> items;
  for (const void* key : groups_[group].members) {
    Entry& e = entries_.at(key);
    SwapItem item{key, swappable(*e.leaf, e.param)};
    if (!item.tensors.empty() && e.stored) items.push_back(std::move(item));
  }
  tier_->read(group, std::move(items));
  groups_[group].in = true;
}

void StateSwap::write_entries(const std::vector<const void*>& keys) {
  std::vector<SwapItem> items;
  for (const void* key : keys) {
    Entry& e = entries_.at(key);
    SwapItem item{key, swappable(*e.leaf, e.param)};
    if (item.tensors.empty()) continue;
    e.stored = true;  // bookkeeping stays on this thread; a failed write fails the run
    items.push_back(std::move(item));
  }
  tier_->write(std::move(items));
}

void StateSwap::write_group(int64_t group) {
  write_entries(groups_[group].members);
  groups_[group].in = false;
}

void StateSwap::begin_step() {
  tier_->begin_step();
  order_.clear();
  current_group_ = -1;
  for (int64_t g = 0; g < std::min<int64_t>(2, groups()); ++g) {
    if (!groups_[g].in) read_group(g);
  }
}

void StateSwap::acquire(LeafOptimizer& leaf, const at::Tensor& param) {
  (void)leaf;
  const void* key = param.unsafeGetTensorImpl();
  order_.push_back(key);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.group < 0) return;  // no state in the tier yet
  const int64_t g = it->second.group;
  if (g > current_group_) {
    // The leaves moved on: what they used before goes back (after its read, in order), then the
    // next group is read ahead.
    for (int64_t h = 0; h < g; ++h) {
      if (groups_[h].in) write_group(h);
    }
    current_group_ = g;
    for (int64_t h = g; h < std::min(g + 2, groups()); ++h) {
      if (!groups_[h].in) read_group(h);
    }
  } else if (!groups_[g].in) {
    // Out of order: back in now (behind its write-back); it is written again at end_step.
    read_group(g);
  }
  tier_->wait_usable(g);
}

void StateSwap::release(LeafOptimizer& leaf, const at::Tensor& param) {
  const void* key = param.unsafeGetTensorImpl();
  if (entries_.count(key)) return;
  if (swappable(leaf, param).empty()) return;
  // State that appeared in this step: out to the tier a group's worth at a time, at most one
  // such group being written while the next fills.
  Entry& e = register_param(leaf, param);
  tier_->count_resident(bytes_in_memory(swappable(leaf, param)));
  fresh_.push_back(key);
  fresh_bytes_ += e.bytes;
  if (fresh_bytes_ >= bucket_bytes_ * merge_buckets_) {
    tier_->throttle();
    write_entries(std::exchange(fresh_, {}));
    fresh_bytes_ = 0;
  }
}

void StateSwap::end_step() {
  for (int64_t g = 0; g < groups(); ++g) {
    if (groups_[g].in) write_group(g);
  }
  if (!fresh_.empty()) write_entries(std::exchange(fresh_, {}));
  fresh_bytes_ = 0;
  current_group_ = -1;
  tier_->finish_step();
  // Lay the groups out in this step's acquire order when it changed (first step, new state).
  std::vector<const void*> layout;
  for (const auto& group : groups_)
    layout.insert(layout.end(), group.members.begin(), group.members.end());
  std::vector<const void*> seen;
  std::unordered_set<const void*> unique;
  for (const void* key : order_) {
    if (entries_.count(key) && unique.insert(key).second) seen.push_back(key);
  }
  if (seen != layout || static_cast<size_t>(entries_.size()) != layout.size()) rebuild_groups(seen);
}

void StateSwap::rebuild_groups(const std::vector<const void*>& order) {
  std::vector<const void*> keys = order;
  std::unordered_set<const void*> placed(order.begin(), order.end());
  for (const auto& [key, e] : entries_) {
    if (!placed.count(key)) keys.push_back(key);  // state not used this step: last
  }
  groups_.clear();
  int64_t bucket_fill = 0, buckets_in_group = 0;
  for (const void* key : keys) {
    if (groups_.empty() || buckets_in_group == merge_buckets_) {
      groups_.emplace_back();
      buckets_in_group = 0;
    }
    Entry& e = entries_.at(key);
    e.group = static_cast<int64_t>(groups_.size()) - 1;
    groups_.back().members.push_back(key);
    bucket_fill += e.bytes;
    if (bucket_fill >= bucket_bytes_) {
      bucket_fill = 0;
      ++buckets_in_group;
    }
  }
}

std::vector<std::pair<std::string, at::Tensor>> StateSwap::read_state(LeafOptimizer& leaf,
                                                                      const at::Tensor& param) {
  tier_->drain();
  auto state = leaf.export_state(param);
  size_t index = 0;  // among the swappable tensors, as the tier placed them
  for (auto& [name, t] : state) {
    if (!(t.defined() && at::isFloatingType(t.scalar_type()) && t.dim() >= 1)) continue;
    if (!state_in_memory(t)) t = tier_->read_home(param.unsafeGetTensorImpl(), index, t);
    ++index;
  }
  return state;
}

void StateSwap::store(const std::vector<std::pair<LeafOptimizer*, at::Tensor>>& params) {
  tier_->drain();
  std::vector<const void*> order;
  for (const auto& group : groups_)
    order.insert(order.end(), group.members.begin(), group.members.end());
  std::vector<const void*> keys;
  int64_t in_memory = 0;  // state imported or created outside steps: not counted yet
  for (const auto& [leaf, param] : params) {
    const std::vector<at::Tensor> tensors = swappable(*leaf, param);
    if (tensors.empty()) continue;
    in_memory += bytes_in_memory(tensors);
    const bool known = entries_.count(param.unsafeGetTensorImpl()) != 0;
    register_param(*leaf, param);
    if (!known) order.push_back(param.unsafeGetTensorImpl());
    keys.push_back(param.unsafeGetTensorImpl());
  }
  tier_->set_resident(in_memory);
  write_entries(keys);
  tier_->drain();
  rebuild_groups(order);
}

}  // namespace mixtrain
