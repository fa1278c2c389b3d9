// One mesh group of a GPU run (docs/architecture.md §7): the same ranks reached through two
// process groups. Tensors on the device go over the device group (NCCL); host tensors -- split
// sizes, flags, config hashes, logged scalars, checkpoint coordination -- over the host group
// (Gloo), where they already are, so no caller moves a few bytes to the device and back.
// barrier() is the host group's. rank(), size() and name() are the host group's, which must
// equal the device group's (checked at construction).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/collectives.h"

namespace mixtrain {

class DeviceRoutedCollectives final : public Collectives {
 public:
  // Throws std::invalid_argument when the groups' ranks or sizes differ.
  DeviceRoutedCollectives(std::shared_ptr<Collectives> host, std::shared_ptr<Collectives> device);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return host_->name(); }

  void all_reduce_sum(at::Tensor& tensor) override;
  at::Tensor all_gather(const at::Tensor& local) override;
  at::Tensor reduce_scatter_sum(const at::Tensor& full) override;
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void barrier() override;

  Collectives& host() { return *host_; }
  Collectives& device() { return *device_; }

 private:
  Collectives& route(const at::Tensor& tensor);

  std::shared_ptr<Collectives> host_;
  std::shared_ptr<Collectives> device_;
};

}  // namespace mixtrain
