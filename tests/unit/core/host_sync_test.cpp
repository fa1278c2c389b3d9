// core/host_sync.h: every read is counted under its site, staging is not, reset zeroes.
#include "mixtrain/core/host_sync.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(HostSyncTest, EveryReadIsCountedUnderItsSite) {
  reset_host_reads();
  const at::Tensor t = at::arange(4, at::kDouble);
  EXPECT_TRUE(read_to_host(t, "a").equal(t));
  EXPECT_EQ(read_double(t[1], "b"), 1.0);
  EXPECT_EQ(read_int64(at::scalar_tensor(7, at::kLong), "b"), 7);
  EXPECT_TRUE(copy_to_device(t, at::kCPU, "c").equal(t));
  const HostReads reads = host_reads();
  EXPECT_EQ(reads.total, 4);
  EXPECT_EQ(reads.by_site, (std::map<std::string, int64_t>{{"a", 1}, {"b", 2}, {"c", 1}}));
  reset_host_reads();
  EXPECT_EQ(host_reads().total, 0);
  EXPECT_TRUE(host_reads().by_site.empty());
}

// Staging does not wait for the device, so it is not a read; on the CPU it is the tensor itself.
TEST(HostSyncTest, StagingToTheCpuIsTheTensorItselfAndNotCounted) {
  reset_host_reads();
  const at::Tensor t = at::arange(6, at::kLong);
  const at::Tensor staged = stage_to_device(t, at::kCPU);
  EXPECT_EQ(staged.data_ptr(), t.data_ptr());
  EXPECT_EQ(host_reads().total, 0);
}

TEST(HostSyncTest, ThreadsLoseNoCount) {
  reset_host_reads();
  const at::Tensor one = at::ones({1}, at::kDouble);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 250; ++k) read_double(one, "t");
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(host_reads().total, 1000);
  EXPECT_EQ(host_reads().by_site.at("t"), 1000);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
