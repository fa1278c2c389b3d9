#include "mixtrain/core/device.h"

#if MIXTRAIN_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <stdexcept>

#include "mixtrain/core/build_info.h"

namespace mixtrain {
#if MIXTRAIN_WITH_CUDA
namespace {

// "cudaErrorNoDevice: no CUDA-capable device is detected"
std::string describe(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

std::string compute_mode_note(int index) {
  int mode = cudaComputeModeDefault;
  if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, index) != cudaSuccess) {
    cudaGetLastError();  // the probe's own error is the one reported
    return "";
  }
  switch (mode) {
    case cudaComputeModeExclusiveProcess:
      return "; it is in exclusive-process compute mode, so another process probably holds it";
    case cudaComputeModeProhibited:
      return "; its compute mode is prohibited (no process may use it)";
    default:
      return "";
  }
}

// The device is usable when a context and a first allocation can be made on it.
void probe(int index) {
  cudaError_t status = cudaSetDevice(index);
  void* block = nullptr;
  if (status == cudaSuccess) status = cudaMalloc(&block, 256);
  if (status == cudaSuccess) status = cudaFree(block);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw std::invalid_argument("cuda:" + std::to_string(index) +
                                " cannot be used (the CUDA runtime reports " + describe(status) +
                                ")" + compute_mode_note(index));
  }
}

int device_count() {
  int devices = 0;
  cudaGetDeviceCount(&devices);
  return devices;
}

}  // namespace

std::string cuda_unavailable_reason() {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return describe(status);
  }
  return devices == 0 ? "0 devices" : "";
}

std::string describe_device(c10::Device device) {
  if (!device.is_cuda()) return device.str();
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, device.index()) != cudaSuccess) {
    cudaGetLastError();
    return device.str();
  }
  char memory[32];
  std::snprintf(memory, sizeof(memory), "%.1f GiB",
                static_cast<double>(properties.totalGlobalMem) / (1 << 30));
  return device.str() + " (" + properties.name + ", " + memory + ", compute capability " +
         std::to_string(properties.major) + "." + std::to_string(properties.minor) + ")";
}

void set_current_device(c10::Device device) {
  if (device.is_cuda()) c10::cuda::set_device(device.index());
}

int cuda_compute_capability_major(c10::Device device) {
  if (!device.is_cuda() || device.index() < 0 || device.index() >= 64) return 0;
  static std::array<std::atomic<int>, 64> known{};  // 0: not read yet; -1: none
  std::atomic<int>& major = known[static_cast<size_t>(device.index())];
  if (major.load() == 0) {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, device.index()) == cudaSuccess) {
      major.store(properties.major);
    } else {
      cudaGetLastError();
      major.store(-1);
    }
  }
  return std::max(major.load(), 0);
}

#else  // a CPU-only build: no CUDA runtime; check_cuda_devices refuses cuda first
namespace {

[[noreturn]] void probe(int) {
  throw std::invalid_argument(no_cuda_build_message());
}

int device_count() {
  return 0;
}

}  // namespace

std::string cuda_unavailable_reason() {
  return "this build is CPU-only";
}

std::string describe_device(c10::Device device) {
  return device.str();
}

void set_current_device(c10::Device device) {
  if (device.is_cuda()) throw std::invalid_argument(no_cuda_build_message());
}

int cuda_compute_capability_major(c10::Device) {
  return 0;
}
#endif

std::string local_ranks_problem(int local_rank, int local_world_size, int device_count) {
  const int ranks = std::max(local_world_size, local_rank + 1);
  if (ranks <= device_count) return "";
  return std::to_string(ranks) + " ranks on this node but " + std::to_string(device_count) +
         " CUDA devices: each rank needs a device of its own (cuda:<LOCAL_RANK>)";
}

c10::Device resolve_rank_device(const std::string& kind, int local_rank, int local_world_size) {
  if (kind == "cpu") return c10::Device(c10::kCPU);
  if (kind != "cuda") {
    throw std::invalid_argument("unknown device '" + kind + "': expected cpu or cuda");
  }
  check_cuda_devices(local_rank, local_world_size);
  probe(local_rank);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

void check_cuda_devices(int local_rank, int local_world_size) {
  if (local_rank < 0) {
    throw std::invalid_argument("local rank " + std::to_string(local_rank) + " is negative");
  }
  if (!built_with_cuda()) throw std::invalid_argument(no_cuda_build_message());
  const std::string reason = cuda_unavailable_reason();
  if (!reason.empty()) {
    throw std::invalid_argument("no CUDA device on this machine (the CUDA runtime reports " +
                                reason + "); use cpu or run where a GPU is");
  }
  const std::string problem = local_ranks_problem(local_rank, local_world_size, device_count());
  if (!problem.empty()) throw std::invalid_argument(problem);
}

}  // namespace mixtrain
