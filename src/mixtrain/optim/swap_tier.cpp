#include "mixtrain/optim/swap_tier.h"

#include <ATen/ATen.h>

namespace mixtrain {

void SwapTier::count_resident(int64_t delta) {
  const int64_t now = resident_.fetch_add(delta) + delta;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void SwapTier::set_resident(int64_t bytes) {
  resident_.store(bytes);
  int64_t peak = peak_.load();
  while (bytes > peak && !peak_.compare_exchange_weak(peak, bytes)) {
  }
}

bool state_in_memory(const at::Tensor& t) {
  return t.numel() == 0 || (t.storage().data() != nullptr && t.storage().nbytes() > 0);
}

void adopt_state_storage(const at::Tensor& t, const at::Tensor& data) {
  t.unsafeGetTensorImpl()->set_storage_keep_dtype(data.storage());
}

void empty_state_storage(const at::Tensor& t) {
  t.unsafeGetTensorImpl()->set_storage_keep_dtype(at::empty({0}, t.options()).storage());
}

}  // namespace mixtrain
