// The CUDA runtime our kernels link (MIXTRAIN_CUDART: the torch wheel's libcudart.so.13) and
// LibTorch's CUDA must be one and the same view of the machine: the same devices, and device
// memory LibTorch allocates is memory our runtime can address. A second, mismatched runtime
// (another major version, or a build against a toolkit the driver does not accept) fails here
// before any kernel test can mislead. Label cuda: skipped without a device (cuda_test_main.cpp).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace MIXTRAIN_FILE_LOCAL {

TEST(CudaRuntime, SameDeviceCountAsLibTorch) {
  int ours = 0;
  ASSERT_EQ(cudaGetDeviceCount(&ours), cudaSuccess);
  EXPECT_EQ(static_cast<int>(c10::cuda::device_count()), ours);
  int runtime_version = 0;
  ASSERT_EQ(cudaRuntimeGetVersion(&runtime_version), cudaSuccess);
  EXPECT_EQ(runtime_version / 1000, 13) << "libcudart " << runtime_version;
}

// Random bytes (not zeros: an unwritten buffer could pass) go to the device through LibTorch and
// come back through our runtime's cudaMemcpy: bitwise equal, since nothing computes on them.
TEST(CudaRuntime, ReadsLibTorchDeviceMemoryBitwise) {
  at::manual_seed(15);
  const at::Tensor host = at::randn({1 << 20}, at::kFloat);
  const at::Tensor device = host.to(at::Device(at::kCUDA, 0));
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, device.data_ptr()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 0);
  std::vector<float> back(host.numel(), -1.0f);
  ASSERT_EQ(cudaMemcpy(back.data(), device.data_ptr(), host.nbytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(std::memcmp(back.data(), host.data_ptr(), host.nbytes()), 0);
}

}  // namespace MIXTRAIN_FILE_LOCAL
