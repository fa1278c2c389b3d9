// The process groups of one job (docs/architecture.md §7, §13).
//
// World rank r = ((replicate * dp_shard + shard) * cp + c) * tp + t: row-major over
// (dp_replicate, dp_shard, cp, tp), as torch's DeviceMesh, tp innermost (a tp group is
// consecutive ranks: the chattiest group on the closest links). Groups seen from rank r:
//   world               all ranks
//   dp_shard_group      FSDP's shard group: the dp_shard x cp ranks of r's replicate row with
//                       r's tp index (torchtitan's dp_shard_cp: the cp ranks hold the same
//                       parameters and different tokens, so they shard and reduce like data ranks)
//   dp_replicate_group  the dp_replicate ranks with r's (shard, c, t) (DDP / HSDP replicas)
//   cp_group            the cp ranks with r's (replicate, shard, t): one sequence's chunks
//   tp_group            the tp ranks with r's (replicate, shard, c): one tensor-parallel model
//   ep_group            blocks of ep consecutive shard indices (ep divides dp_shard) with r's
//                       (replicate, c, t)
//   expert_dp_group     the ranks holding the same experts: r's tp index and position in its ep
//                       block, over every replicate row, block and cp index (their expert
//                       gradients are summed)
//   background          all ranks, on a connection of its own: for collectives issued from
//                       another thread (async checkpoint saves), which must never interleave
//                       with the training's on the same connection
// Group-local rank order is world-rank order. A one-rank group is a LocalCollectives; groups
// with the same members share one process group. Data: the dp_size() = dp_replicate x dp_shard
// data ranks read different batches (data_rank()); cp and tp ranks of one data rank read the
// same batch (cp ranks then keep their own chunks of it).
//
// Backends: on the CPU every group is Gloo. On CUDA (`device` = cuda:<LOCAL_RANK>) the compute
// groups (dp_shard, dp_replicate, cp, tp, ep, expert_dp: parameters, gradients, activations,
// tokens, optimizer updates) are NCCL (nccl_collectives.h, device tensors), while world and
// background stay Gloo: they carry host values only (config agreement, the interrupt flag, loss
// averaging, checkpoint coordination strings), which NCCL would have to copy to the device and
// back.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "mixtrain/config/trainer_config.h"
#include "mixtrain/core/collectives.h"
#include "mixtrain/distributed/rendezvous.h"

namespace mixtrain {

struct DeviceMesh {
  int rank = 0, world_size = 1;
  int64_t dp_replicate = 1, dp_shard = 1, ep = 1, cp = 1, tp = 1;
  c10::Device device = c10::kCPU;  // where this rank computes (core/device.h)
  std::shared_ptr<Collectives> world, dp_shard_group, dp_replicate_group, ep_group, expert_dp_group;
  std::shared_ptr<Collectives> cp_group, tp_group;
  std::shared_ptr<Collectives> background;
  // Every call of this rank's groups but background's (training traffic), whichever thread
  // makes it; background's calls are in background->counters().
  std::shared_ptr<CollectiveCounters> counters = std::make_shared<CollectiveCounters>();

  int64_t tp_index() const { return rank % tp; }
  int64_t cp_index() const { return (rank / tp) % cp; }
  int64_t shard_index() const { return (rank / (tp * cp)) % dp_shard; }
  int64_t replicate_index() const { return rank / (tp * cp * dp_shard); }
  // Which batch this rank reads: replicate_index * dp_shard + shard_index, of dp_size().
  int64_t data_rank() const { return replicate_index() * dp_shard + shard_index(); }
  int64_t dp_size() const { return dp_replicate * dp_shard; }
};

// One process: every group is a LocalCollectives.
DeviceMesh make_single_process_mesh(c10::Device device = c10::kCPU);

// Joins the job described by `rank` (see detect_rank_info). Checks first (std::invalid_argument,
// before any connection; the config's keys are validate_config's and join_mesh's to name):
// timeout_s > 0, every degree >= 1, world size == dp_replicate * dp_shard * cp * tp, ep divides
// dp_shard. Then rendezvous on a TCPStore hosted by rank 0 at MASTER_ADDR:MASTER_PORT; ranks
// start at different times, so joining waits up to max(timeout_s, 30 s); afterwards store reads
// and every Gloo collective time out after timeout_s. Gloo binds to the interfaces in
// GLOO_SOCKET_IFNAME (comma-separated) if set, else to loopback when MASTER_ADDR is a loopback
// address, else to the address this host's name resolves to. Every rank must build its meshes
// in the same order (each one gets its own store prefix). With a CUDA `device` (the calling
// thread's current one, core/device.h) the compute groups' NCCL communicators are created here,
// during the rendezvous, each NCCL collective timing out after timeout_s as well.
DeviceMesh make_device_mesh(const RankInfo& rank, const ParallelConfig& parallel, double timeout_s,
                            c10::Device device = c10::kCPU);

// The world ranks of each group kind for `rank`, in group-rank order (pure; the mesh and the
// tests use it). Throws std::invalid_argument on the same conditions as make_device_mesh.
struct MeshLayout {
  std::vector<int> world, dp_shard, dp_replicate, ep, expert_dp, cp, tp;
};
MeshLayout mesh_layout(int rank, int world_size, const ParallelConfig& parallel);

}  // namespace mixtrain
