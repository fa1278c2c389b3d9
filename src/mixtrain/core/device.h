// The device one rank computes on: train.device (docs/architecture.md §7).
//
// "cpu" is the CPU. "cuda" is cuda:<local_rank>, one device per rank of a node, after three
// checks in this order, each failure a std::invalid_argument of one sentence (the trainer keys
// it as train.device, exit 2): the CUDA runtime sees a device at all (its own report quoted
// when not), the node's ranks fit on its devices (local_ranks_problem), and the device is
// usable: a first allocation there succeeds (a device in exclusive-process mode held by another
// process, or otherwise unavailable, fails it; the message names the device and its compute
// mode). The probe leaves cuda:<local_rank> the calling thread's current device.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace mixtrain {

c10::Device resolve_rank_device(const std::string& kind, int local_rank, int local_world_size);

// The first two checks, which make no CUDA context (`mixtrain train --nproc N` runs them before
// starting its workers: a context there would hold device 0 for the whole run).
void check_cuda_devices(int local_rank, int local_world_size);

// The first check alone: "" when the CUDA runtime sees at least one device, else its report
// ("cudaErrorNoDevice: no CUDA-capable device is detected", or "0 devices").
std::string cuda_unavailable_reason();

// The second check alone (pure): "" when every rank of the node has a device of its own, else
// "<N> ranks on this node but <M> CUDA devices ...". N is local_world_size, at least
// local_rank + 1 (a launcher that does not say how many ranks share the node).
std::string local_ranks_problem(int local_rank, int local_world_size, int device_count);

// For the startup log: "cpu", or e.g. "cuda:0 (NVIDIA H200, 139.8 GiB, compute capability 9.0)".
std::string describe_device(c10::Device device);

// The major compute capability of a CUDA device (9 for an H100/H200), read once per device and
// kept; 0 for any other device, a device the runtime cannot describe, or a CPU-only build.
int cuda_compute_capability_major(c10::Device device);

// Makes `device` the calling thread's current CUDA device (every thread that launches work on
// it: the training loop, autograd, an async checkpoint thread); nothing for the CPU.
void set_current_device(c10::Device device);

}  // namespace mixtrain
