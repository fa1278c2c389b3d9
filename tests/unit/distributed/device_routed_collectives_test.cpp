#include "mixtrain/distributed/device_routed_collectives.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace mixtrain {
namespace {

// Records which operations reached it; every call is the identity of a one-rank group.
class RecordingCollectives final : public Collectives {
 public:
  RecordingCollectives(std::string name, int rank, int size)
      : name_(std::move(name)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  void all_reduce_sum(at::Tensor&) override { calls.push_back("all_reduce"); }
  at::Tensor all_gather(const at::Tensor& local) override {
    calls.push_back("all_gather");
    return local;
  }
  at::Tensor reduce_scatter_sum(const at::Tensor& full) override {
    calls.push_back("reduce_scatter");
    return full;
  }
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>&,
                        const std::vector<int64_t>&) override {
    calls.push_back("all_to_all");
    return input;
  }
  void broadcast(at::Tensor&, int) override { calls.push_back("broadcast"); }
  void barrier() override { calls.push_back("barrier"); }
  std::vector<std::string> calls;

 private:
  std::string name_;
  int rank_, size_;
};

// Host tensors go to the host group, every other device's to the device group. The meta
// device stands in for a GPU here (no GPU on the CI machines): routing reads only the device.
TEST(DeviceRoutedCollectives, RoutesEachCallByTheTensorsDevice) {
  auto host = std::make_shared<RecordingCollectives>("dp_shard", 1, 2);
  auto device = std::make_shared<RecordingCollectives>("dp_shard/device", 1, 2);
  DeviceRoutedCollectives group(host, device);
  EXPECT_EQ(group.rank(), 1);
  EXPECT_EQ(group.size(), 2);
  EXPECT_EQ(group.name(), "dp_shard");

  at::Tensor on_host = at::zeros({4});
  at::Tensor on_device = at::empty({4}, at::TensorOptions().device(at::kMeta));
  group.all_reduce_sum(on_host);
  group.all_reduce_sum(on_device);
  group.all_gather(on_device);
  group.reduce_scatter_sum(on_device);
  group.all_to_all(on_host, {2, 2}, {2, 2});
  group.all_to_all(on_device, {2, 2}, {2, 2});
  group.broadcast(on_host, 0);
  group.broadcast(on_device, 0);
  group.barrier();
  EXPECT_EQ(host->calls,
            (std::vector<std::string>{"all_reduce", "all_to_all", "broadcast", "barrier"}));
  EXPECT_EQ(device->calls, (std::vector<std::string>{"all_reduce", "all_gather", "reduce_scatter",
                                                     "all_to_all", "broadcast"}));
}

TEST(DeviceRoutedCollectives, GroupsOfDifferentRanksAreRefused) {
  auto host = std::make_shared<RecordingCollectives>("ep", 0, 2);
  try {
    DeviceRoutedCollectives group(host, std::make_shared<RecordingCollectives>("ep/nccl", 1, 2));
    FAIL() << "no error";
  } catch (const std::invalid_argument& error) {
    EXPECT_STREQ(error.what(),
                 "DeviceRoutedCollectives: host group ep (rank 0 of 2) and device group ep/nccl "
                 "(rank 1 of 2) differ");
  }
  EXPECT_THROW(DeviceRoutedCollectives(host, std::make_shared<RecordingCollectives>("ep", 0, 4)),
               std::invalid_argument);
  EXPECT_THROW(DeviceRoutedCollectives(host, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace mixtrain
