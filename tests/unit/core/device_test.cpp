// resolve_rank_device: cpu, and cuda's three checks in order (core/device.h). A CPU-only build
// refuses cuda first, saying what it is; on a machine without a CUDA device (this project's CI)
// the cuda cases check the refusal; on a GPU machine the same tests check that cuda:<local_rank>
// resolves and that too many local ranks are refused.
#include "mixtrain/core/device.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "mixtrain/core/build_info.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

std::string device_error_of(const std::string& kind, int local_rank, int local_world_size) {
  try {
    resolve_rank_device(kind, local_rank, local_world_size);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(RankDevice, CpuIsTheCpuForEveryLocalRank) {
  EXPECT_EQ(resolve_rank_device("cpu", 0, 1), c10::Device(c10::kCPU));
  EXPECT_EQ(resolve_rank_device("cpu", 3, 8), c10::Device(c10::kCPU));
}

TEST(RankDevice, UnknownKindIsRefused) {
  EXPECT_EQ(device_error_of("tpu", 0, 1), "unknown device 'tpu': expected cpu or cuda");
}

TEST(RankDevice, CudaIsTheLocalRanksDeviceOrOneClearRefusal) {
  if (!built_with_cuda()) {
    const std::string refusal = device_error_of("cuda", 0, 1);
    EXPECT_EQ(refusal, no_cuda_build_message());
    EXPECT_EQ(refusal.rfind("this mixtrain build is CPU-only (", 0), 0u) << refusal;
    EXPECT_NE(refusal.find("CUDA toolkit"), std::string::npos) << refusal;  // how to get one
    EXPECT_EQ(refusal.find('\n'), std::string::npos);
    EXPECT_EQ(device_error_of("cuda", 5, 8), refusal);
    EXPECT_THROW(set_current_device(c10::Device(c10::kCUDA, 0)), std::invalid_argument);
    return;
  }
  const std::string reason = cuda_unavailable_reason();
  if (!reason.empty()) {
    // No device: the first check fails, quoting the runtime, whatever the ranks.
    const std::string expected = "no CUDA device on this machine (the CUDA runtime reports " +
                                 reason + "); use cpu or run where a GPU is";
    EXPECT_EQ(device_error_of("cuda", 0, 1), expected);
    EXPECT_EQ(device_error_of("cuda", 5, 8), expected);
    EXPECT_EQ(expected.find('\n'), std::string::npos);
    return;
  }
  EXPECT_EQ(resolve_rank_device("cuda", 0, 1), c10::Device(c10::kCUDA, 0));
  // A node asking for more ranks than it has devices: the second check, before any probe.
  const std::string too_many = device_error_of("cuda", 0, 4096);
  EXPECT_NE(too_many.find("4096 ranks on this node but "), std::string::npos) << too_many;
}

TEST(RankDevice, LocalRanksMustFitOnTheDevices) {
  EXPECT_EQ(local_ranks_problem(0, 1, 1), "");
  EXPECT_EQ(local_ranks_problem(7, 8, 8), "");
  EXPECT_EQ(local_ranks_problem(0, 2, 1),
            "2 ranks on this node but 1 CUDA devices: each rank needs a device of its own "
            "(cuda:<LOCAL_RANK>)");
  // No local size from the launcher (Slurm): local rank 3 means at least 4 ranks here.
  EXPECT_EQ(local_ranks_problem(3, 1, 2),
            "4 ranks on this node but 2 CUDA devices: each rank needs a device of its own "
            "(cuda:<LOCAL_RANK>)");
  EXPECT_EQ(local_ranks_problem(1, 1, 2), "");
}

TEST(RankDevice, SettingTheCpuCurrentDoesNothing) {
  EXPECT_NO_THROW(set_current_device(c10::Device(c10::kCPU)));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

// The CPU is named as such; a CUDA device the runtime cannot describe (no driver here) falls
// back to its name, so the startup log never fails on the description.
TEST(RankDevice, DescriptionNamesTheDevice) {
  EXPECT_EQ(describe_device(c10::Device(c10::kCPU)), "cpu");
  const std::string cuda = describe_device(c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(cuda.rfind("cuda:0", 0), 0u) << cuda;
  if (!cuda_unavailable_reason().empty()) {
    EXPECT_EQ(cuda, "cuda:0");
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
