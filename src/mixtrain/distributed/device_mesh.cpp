#include "mixtrain/distributed/device_mesh.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "mixtrain/core/build_info.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/logging.h"
#include "mixtrain/core/text.h"
#include "mixtrain/distributed/collective_checks.h"
#include "mixtrain/distributed/gloo_collectives.h"
#if MIXTRAIN_WITH_CUDA
#include "mixtrain/distributed/nccl_collectives.h"
#endif

namespace mixtrain {
namespace {

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// One TCPStore per process and master address: rank 0 serves it for the whole job, and a
// process that builds several meshes (tests) reuses it under a fresh key prefix each time.
struct StoreRegistry {
  std::mutex mutex;
  std::map<std::string, c10::intrusive_ptr<c10d::Store>> stores;
  std::map<std::string, int> meshes_built;
};
StoreRegistry& registry() {
  static StoreRegistry* instance = new StoreRegistry();  // never destroyed: outlives statics
  return *instance;
}

c10::intrusive_ptr<c10d::Store> connect_store(const RankInfo& info, double join_timeout_s) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(info.master_port);
  options.isServer = info.rank == 0;
  options.numWorkers = static_cast<std::size_t>(info.world_size);
  options.waitWorkers = false;  // we wait in join(), with our own timeout and message
  options.timeout = to_ms(join_timeout_s);
  options.useLibUV = true;  // the libuv server (2.x default; the wheel has libuv)
  try {
    return c10::make_intrusive<c10d::TCPStore>(info.master_addr, options);
  } catch (const std::exception& error) {
    throw UserError("rendezvous: rank " + std::to_string(info.rank) + " cannot " +
                    (info.rank == 0 ? "host" : "reach") + " the store at " + info.master_addr +
                    ":" + std::to_string(info.master_port) + " (waited up to " +
                    std::to_string(static_cast<int>(join_timeout_s)) + " s): " + first_line(error));
  }
}

// Every rank checks in; returns when all world_size ranks have, or throws after the timeout.
void join(c10d::Store& store, const RankInfo& info, double join_timeout_s) {
  try {
    const int64_t arrived = store.add("join", 1);
    if (arrived == info.world_size) store.set("joined", std::vector<uint8_t>{1});
    store.wait({"joined"}, to_ms(join_timeout_s));
  } catch (const std::exception& error) {
    int64_t arrived = -1;
    try {
      arrived = store.add("join", 0);
    } catch (const std::exception&) {
    }
    throw UserError("rendezvous: rank " + std::to_string(info.rank) + " waited " +
                    std::to_string(static_cast<int>(join_timeout_s)) + " s for all " +
                    std::to_string(info.world_size) + " ranks to join at " + info.master_addr +
                    ":" + std::to_string(info.master_port) +
                    (arrived >= 0 ? ", " + std::to_string(arrived) + " joined" : std::string()) +
                    ": " + first_line(error));
  }
}

bool is_loopback(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "localhost" || address == "::1";
}

std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices(const RankInfo& info) {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  const char* interfaces = std::getenv("GLOO_SOCKET_IFNAME");
  if (interfaces != nullptr && *interfaces != '\0') {
    std::stringstream list(interfaces);
    std::string name;
    while (std::getline(list, name, ',')) {
      if (!name.empty()) devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
    }
  }
  if (devices.empty()) {
    devices.push_back(is_loopback(info.master_addr)
                          ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                          : c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return devices;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (int r : ranks) parts.push_back(std::to_string(r));
  return mixtrain::join(parts, ",");  // not the rendezvous join above
}

}  // namespace

MeshLayout mesh_layout(int rank, int world_size, const ParallelConfig& parallel) {
  const int64_t replicate = parallel.dp_replicate;
  const int64_t shard = parallel.dp_shard;
  const int64_t ep = parallel.ep;
  const int64_t cp = parallel.cp;
  const int64_t tp = parallel.tp;
  // validate_config and join_mesh refuse these first in the user's keys; here they are the
  // layout's invariants.
  if (replicate < 1 || shard < 1 || ep < 1 || cp < 1 || tp < 1) {
    throw std::invalid_argument("mesh_layout: degrees must be >= 1, got replicate " +
                                std::to_string(replicate) + ", shard " + std::to_string(shard) +
                                ", ep " + std::to_string(ep) + ", cp " + std::to_string(cp) +
                                ", tp " + std::to_string(tp));
  }
  if (parallel.world_size() != world_size) {
    throw std::invalid_argument(
        "mesh_layout: replicate x shard x cp x tp = " + std::to_string(replicate) + " x " +
        std::to_string(shard) + " x " + std::to_string(cp) + " x " + std::to_string(tp) + " = " +
        std::to_string(parallel.world_size()) + " must equal the world size " +
        std::to_string(world_size));
  }
  if (shard % ep != 0) {
    throw std::invalid_argument("mesh_layout: ep " + std::to_string(ep) +
                                " must divide the shard degree " + std::to_string(shard));
  }
  if (rank < 0 || rank >= world_size) {
    throw std::invalid_argument("mesh_layout: rank " + std::to_string(rank) + " out of range");
  }
  const int64_t t = rank % tp, c = (rank / tp) % cp, s = (rank / (tp * cp)) % shard,
                i = rank / (tp * cp * shard);
  const int64_t block = s / ep, position = s % ep;
  auto at = [&](int64_t ri, int64_t si, int64_t ci, int64_t ti) {
    return static_cast<int>(((ri * shard + si) * cp + ci) * tp + ti);
  };
  MeshLayout layout;
  for (int r = 0; r < world_size; ++r) layout.world.push_back(r);
  for (int64_t sj = 0; sj < shard; ++sj) {
    for (int64_t cj = 0; cj < cp; ++cj) layout.dp_shard.push_back(at(i, sj, cj, t));
  }
  for (int64_t ri = 0; ri < replicate; ++ri) layout.dp_replicate.push_back(at(ri, s, c, t));
  for (int64_t cj = 0; cj < cp; ++cj) layout.cp.push_back(at(i, s, cj, t));
  for (int64_t tj = 0; tj < tp; ++tj) layout.tp.push_back(at(i, s, c, tj));
  for (int64_t k = 0; k < ep; ++k) layout.ep.push_back(at(i, block * ep + k, c, t));
  for (int64_t ri = 0; ri < replicate; ++ri) {
    for (int64_t b = 0; b < shard / ep; ++b) {
      for (int64_t cj = 0; cj < cp; ++cj)
        layout.expert_dp.push_back(at(ri, b * ep + position, cj, t));
    }
  }
  return layout;
}

namespace {
// The training groups count into mesh.counters; background into a set of its own.
void count_calls(DeviceMesh& mesh) {
  for (Collectives* group :
       {mesh.world.get(), mesh.dp_shard_group.get(), mesh.dp_replicate_group.get(),
        mesh.ep_group.get(), mesh.expert_dp_group.get(), mesh.cp_group.get(),
        mesh.tp_group.get()}) {
    group->count_into(mesh.counters);
  }
  mesh.background->count_into(std::make_shared<CollectiveCounters>());
}
}  // namespace

DeviceMesh make_single_process_mesh(c10::Device device) {
  DeviceMesh mesh;
  mesh.device = device;
  mesh.world = make_local_collectives("world");
  mesh.dp_shard_group = make_local_collectives("dp_shard");
  mesh.dp_replicate_group = make_local_collectives("dp_replicate");
  mesh.ep_group = make_local_collectives("ep");
  mesh.expert_dp_group = make_local_collectives("expert_dp");
  mesh.cp_group = make_local_collectives("cp");
  mesh.tp_group = make_local_collectives("tp");
  mesh.background = make_local_collectives("background");
  count_calls(mesh);
  return mesh;
}

DeviceMesh make_device_mesh(const RankInfo& info, const ParallelConfig& parallel, double timeout_s,
                            c10::Device device) {
  if (!(timeout_s > 0)) {
    throw std::invalid_argument("make_device_mesh: timeout_s must be > 0, got " +
                                std::to_string(timeout_s));
  }
  const MeshLayout layout = mesh_layout(info.rank, info.world_size, parallel);
  DeviceMesh mesh;
  mesh.rank = info.rank;
  mesh.world_size = info.world_size;
  mesh.dp_replicate = parallel.dp_replicate;
  mesh.dp_shard = parallel.dp_shard;
  mesh.ep = parallel.ep;
  mesh.cp = parallel.cp;
  mesh.tp = parallel.tp;
  mesh.device = device;
  if (info.world_size == 1) {
    DeviceMesh single = make_single_process_mesh();
    mesh.world = single.world;
    mesh.dp_shard_group = single.dp_shard_group;
    mesh.dp_replicate_group = single.dp_replicate_group;
    mesh.ep_group = single.ep_group;
    mesh.expert_dp_group = single.expert_dp_group;
    mesh.cp_group = single.cp_group;
    mesh.tp_group = single.tp_group;
    mesh.background = single.background;
    mesh.counters = single.counters;
    return mesh;
  }

  const double join_timeout_s = std::max(timeout_s, 30.0);
  c10::intrusive_ptr<c10d::Store> store;
  std::string prefix;
  {
    StoreRegistry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    const std::string address = info.master_addr + ":" + std::to_string(info.master_port);
    auto& cached = reg.stores[address];
    if (!cached) cached = connect_store(info, join_timeout_s);
    store = cached;
    prefix = "mixtrain/mesh" + std::to_string(reg.meshes_built[address]++) + "/";
  }
  auto mesh_store = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  join(*mesh_store, info, join_timeout_s);
  mesh_store->setTimeout(to_ms(timeout_s));
  store->setTimeout(to_ms(timeout_s));

  const auto devices = gloo_devices(info);
  std::map<std::pair<bool, std::vector<int>>, c10::intrusive_ptr<c10d::ProcessGroupGloo>> groups;
  auto make_group = [&](const char* name, const std::vector<int>& members,
                        bool own_connection = false) -> std::shared_ptr<Collectives> {
    if (members.size() == 1) return make_local_collectives(name);
    auto& group = groups[{own_connection, members}];
    if (!group) {
      const int group_rank =
          static_cast<int>(std::find(members.begin(), members.end(), info.rank) - members.begin());
      auto options = c10d::ProcessGroupGloo::Options::create(to_ms(timeout_s));
      options->devices = devices;
      options->threads = 1;  // every call waits for its Work: a second thread would idle
      auto group_store = c10::make_intrusive<c10d::PrefixStore>(
          std::string(name) + "/" + join_ranks(members), mesh_store);
      try {
        group = c10::make_intrusive<c10d::ProcessGroupGloo>(
            group_store, group_rank, static_cast<int>(members.size()), options);
      } catch (const std::exception& error) {
        throw UserError("rendezvous: rank " + std::to_string(info.rank) + " cannot connect the " +
                        name + " group (ranks " + join_ranks(members) + "): " + first_line(error));
      }
    }
    return std::make_shared<GlooCollectives>(group, name, info.rank);
  };
  // The compute groups on CUDA: one NCCL communicator per member set, created now (collective
  // over its members, like the Gloo connections above). A CPU-only build has no NCCL (and no
  // rank gets a CUDA device there: core/device.h refuses it first).
#if MIXTRAIN_WITH_CUDA
  std::map<std::vector<int>, std::shared_ptr<NcclGroup>> nccl_groups;
#endif
  auto make_compute_group = [&](const char* name,
                                const std::vector<int>& members) -> std::shared_ptr<Collectives> {
    if (!device.is_cuda()) return make_group(name, members);
#if !MIXTRAIN_WITH_CUDA
    throw UserError("rendezvous: " + device.str() + ": " + no_cuda_build_message());
#else
    if (members.size() == 1) return make_local_collectives(name);
    auto& group = nccl_groups[members];
    if (!group) {
      const int group_rank =
          static_cast<int>(std::find(members.begin(), members.end(), info.rank) - members.begin());
      auto group_store = c10::make_intrusive<c10d::PrefixStore>(
          "nccl/" + std::string(name) + "/" + join_ranks(members), mesh_store);
      try {
        group = std::make_shared<NcclGroup>(
            group_store, group_rank, static_cast<int>(members.size()), device, to_ms(timeout_s));
        group->connect();
      } catch (const c10::DistError& error) {
        throw UserError(
            "rendezvous: rank " + std::to_string(info.rank) + " cannot connect the NCCL " + name +
            " group (ranks " + join_ranks(members) + ") on " + device.str() + " within " +
            std::to_string(static_cast<int64_t>(std::ceil(timeout_s))) +
            " s (distributed.timeout_s; a member is missing, hung or died): " + first_line(error));
      }
    }
    return std::make_shared<NcclCollectives>(group, name, info.rank);
#endif
  };
  // Same kind order on every rank: each kind partitions the world, so no rank waits on a group
  // whose other members are busy connecting a different one.
  mesh.world = make_group("world", layout.world);
  mesh.dp_shard_group = make_compute_group("dp_shard", layout.dp_shard);
  mesh.dp_replicate_group = make_compute_group("dp_replicate", layout.dp_replicate);
  mesh.ep_group = make_compute_group("ep", layout.ep);
  mesh.expert_dp_group = make_compute_group("expert_dp", layout.expert_dp);
  mesh.cp_group = make_compute_group("cp", layout.cp);
  mesh.tp_group = make_compute_group("tp", layout.tp);
  mesh.background = make_group("background", layout.world, /*own_connection=*/true);
  count_calls(mesh);
  return mesh;
}

}  // namespace mixtrain
