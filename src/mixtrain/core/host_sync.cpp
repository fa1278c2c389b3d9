#include "mixtrain/core/host_sync.h"

#include <ATen/ATen.h>

#include <mutex>

namespace mixtrain {
namespace {

std::mutex& reads_mutex() {
  static std::mutex mutex;
  return mutex;
}
HostReads& reads() {
  static HostReads counted;
  return counted;
}

void count(const char* site) {
  std::lock_guard<std::mutex> lock(reads_mutex());
  reads().total += 1;
  reads().by_site[site] += 1;
}

}  // namespace

at::Tensor read_to_host(const at::Tensor& t, const char* site) {
  count(site);
  return t.cpu();
}

double read_double(const at::Tensor& t, const char* site) {
  count(site);
  return t.item<double>();
}

int64_t read_int64(const at::Tensor& t, const char* site) {
  count(site);
  return t.item<int64_t>();
}

at::Tensor copy_to_device(const at::Tensor& host, c10::Device device, const char* site) {
  count(site);
  return host.to(device);
}

at::Tensor stage_to_device(const at::Tensor& host, c10::Device device) {
  if (host.device() == device) return host;
  if (!device.is_cuda() || !host.is_cpu()) return host.to(device);
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

HostReads host_reads() {
  std::lock_guard<std::mutex> lock(reads_mutex());
  return reads();
}

void reset_host_reads() {
  std::lock_guard<std::mutex> lock(reads_mutex());
  reads() = HostReads{};
}

}  // namespace mixtrain
