#include "mixtrain/distributed/device_routed_collectives.h"

#include <stdexcept>
#include <utility>

namespace mixtrain {

DeviceRoutedCollectives::DeviceRoutedCollectives(std::shared_ptr<Collectives> host,
                                                 std::shared_ptr<Collectives> device)
    : host_(std::move(host)), device_(std::move(device)) {
  if (!host_ || !device_) throw std::invalid_argument("DeviceRoutedCollectives: a group is null");
  if (host_->rank() != device_->rank() || host_->size() != device_->size()) {
    throw std::invalid_argument("DeviceRoutedCollectives: host group " + host_->name() + " (rank " +
                                std::to_string(host_->rank()) + " of " +
                                std::to_string(host_->size()) + ") and device group " +
                                device_->name() + " (rank " + std::to_string(device_->rank()) +
                                " of " + std::to_string(device_->size()) + ") differ");
  }
}

Collectives& DeviceRoutedCollectives::route(const at::Tensor& tensor) {
  return tensor.device().is_cpu() ? *host_ : *device_;
}

void DeviceRoutedCollectives::all_reduce_sum(at::Tensor& tensor) {
  route(tensor).all_reduce_sum(tensor);
}

at::Tensor DeviceRoutedCollectives::all_gather(const at::Tensor& local) {
  return route(local).all_gather(local);
}

at::Tensor DeviceRoutedCollectives::reduce_scatter_sum(const at::Tensor& full) {
  return route(full).reduce_scatter_sum(full);
}

at::Tensor DeviceRoutedCollectives::all_to_all(const at::Tensor& input,
                                               const std::vector<int64_t>& send_counts,
                                               const std::vector<int64_t>& recv_counts) {
  return route(input).all_to_all(input, send_counts, recv_counts);
}

void DeviceRoutedCollectives::broadcast(at::Tensor& tensor, int root) {
  route(tensor).broadcast(tensor, root);
}

void DeviceRoutedCollectives::barrier() {
  host_->barrier();
}

}  // namespace mixtrain
