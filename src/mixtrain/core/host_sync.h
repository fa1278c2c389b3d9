// Host reads of device values, counted (docs/architecture.md §12, "Host reads are counted").
//
// On a GPU, a blocking read of a device tensor by the host (.item(), .cpu()) or a blocking copy
// from pageable host memory to the device waits until the device's stream has run everything
// queued before it: the host stops queueing work and the device then idles until the host has
// caught up. The training step's code makes such reads and copies only through these
// functions, which count every call per process and per site, on every device: on the CPU they
// cost nothing and count the same, so a CPU test holds the GPU step's code to its budget (the
// logging read at log steps). Thread-safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace mixtrain {

// t.cpu(): the host's copy of `t` (itself when already on the CPU). Counted under `site`.
at::Tensor read_to_host(const at::Tensor& t, const char* site);
// t.item<double>() / t.item<int64_t>() of a one-element tensor. Counted under `site`.
double read_double(const at::Tensor& t, const char* site);
int64_t read_int64(const at::Tensor& t, const char* site);
// A blocking copy of host tensor `host` to `device` (the host waits; on the CPU `host`
// itself). Counted under `site`; for what is copied once (tables cached per device), not per
// step. Per-step inputs take stage_to_device instead.
at::Tensor copy_to_device(const at::Tensor& host, c10::Device device, const char* site);
// `host` on `device` without a host wait: on a CUDA device it is copied into pinned host
// memory and from there with non_blocking (the copy is queued on the current stream; the
// pinned buffer is not reused before the copy has run: the pinned allocator records the
// stream). On the CPU: `host` itself. Not counted: it does not synchronise.
at::Tensor stage_to_device(const at::Tensor& host, c10::Device device);

struct HostReads {
  int64_t total = 0;
  std::map<std::string, int64_t> by_site;
};
// Every counted read since the last reset.
HostReads host_reads();
void reset_host_reads();

}  // namespace mixtrain
