// Mesh group membership against the row-major formula r = ((replicate * dp_shard + shard) * cp +
// c) * tp + t, both as a pure layout and on real Gloo groups (each group all-gathers its
// members' world ranks); the layout errors raised before any connection.
#include "mixtrain/distributed/device_mesh.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <thread>

#include "support/multiprocess.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using testing::run_workers;
using testing::WorkerResult;

ParallelConfig degrees(int64_t replicate, int64_t shard, int64_t ep, int64_t cp = 1,
                       int64_t tp = 1) {
  ParallelConfig parallel;
  parallel.dp_replicate = replicate;
  parallel.dp_shard = shard;
  parallel.ep = ep;
  parallel.cp = cp;
  parallel.tp = tp;
  return parallel;
}

// The groups written out from the definition, by brute force over all ranks: each rank's
// coordinates (replicate, shard, c, t) decoded with tp fastest, then each group's rule.
std::vector<int> expected_members(const std::string& kind, int rank, const ParallelConfig& p) {
  struct At {
    int64_t rep, shard, c, t;
  };
  auto at = [&](int64_t r) {
    return At{r / (p.tp * p.cp * p.dp_shard), (r / (p.tp * p.cp)) % p.dp_shard, (r / p.tp) % p.cp,
              r % p.tp};
  };
  const At me = at(rank);
  std::vector<int> members;
  for (int r = 0; r < p.world_size(); ++r) {
    const At o = at(r);
    bool same = true;
    if (kind == "dp_shard") same = o.rep == me.rep && o.t == me.t;  // dp_shard x cp
    if (kind == "dp_replicate") same = o.shard == me.shard && o.c == me.c && o.t == me.t;
    if (kind == "cp") same = o.rep == me.rep && o.shard == me.shard && o.t == me.t;
    if (kind == "tp") same = o.rep == me.rep && o.shard == me.shard && o.c == me.c;
    if (kind == "ep") {
      same = o.rep == me.rep && o.c == me.c && o.t == me.t && o.shard / p.ep == me.shard / p.ep;
    }
    if (kind == "expert_dp") same = o.t == me.t && o.shard % p.ep == me.shard % p.ep;
    if (same) members.push_back(r);
  }
  return members;
}

const ParallelConfig kLayouts[] = {
    degrees(1, 2, 1),       degrees(2, 2, 1),       degrees(1, 4, 2),       degrees(2, 2, 2),
    degrees(1, 1, 1, 2, 2), degrees(1, 2, 2, 2, 2), degrees(2, 1, 1, 1, 2), degrees(1, 2, 1, 3, 1)};

TEST(DeviceMeshTest, LayoutMatchesTheRowMajorFormula) {
  for (const ParallelConfig& p : kLayouts) {
    const int world = static_cast<int>(p.world_size());
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(std::to_string(p.dp_replicate) + "x" + std::to_string(p.dp_shard) + "x" +
                   std::to_string(p.cp) + "x" + std::to_string(p.tp) + " ep " +
                   std::to_string(p.ep) + " rank " + std::to_string(rank));
      const MeshLayout layout = mesh_layout(rank, world, p);
      EXPECT_EQ(layout.world.size(), static_cast<size_t>(world));
      for (const auto& [kind, got] :
           {std::pair<std::string, std::vector<int>>{"dp_shard", layout.dp_shard},
            {"dp_replicate", layout.dp_replicate},
            {"cp", layout.cp},
            {"tp", layout.tp},
            {"ep", layout.ep},
            {"expert_dp", layout.expert_dp}}) {
        EXPECT_EQ(got, expected_members(kind, rank, p)) << kind;
      }
    }
  }
  // Spot checks written out by hand: 2x2 with ep 2, rank 3 = (row 1, column 1).
  const MeshLayout hand = mesh_layout(3, 4, degrees(2, 2, 2));
  EXPECT_EQ(hand.dp_shard, (std::vector<int>{2, 3}));
  EXPECT_EQ(hand.dp_replicate, (std::vector<int>{1, 3}));
  EXPECT_EQ(hand.ep, (std::vector<int>{2, 3}));
  EXPECT_EQ(hand.expert_dp, (std::vector<int>{1, 3}));
  // 1x4 with ep 2, rank 2: ep block {2, 3}, same experts as rank 0.
  const MeshLayout row = mesh_layout(2, 4, degrees(1, 4, 2));
  EXPECT_EQ(row.ep, (std::vector<int>{2, 3}));
  EXPECT_EQ(row.expert_dp, (std::vector<int>{0, 2}));
  // The seed's 8 ranks, dp_shard 2 x cp 2 x tp 2 with ep 2: rank 5 = (shard 1, c 0, t 1).
  const MeshLayout seed = mesh_layout(5, 8, degrees(1, 2, 2, 2, 2));
  EXPECT_EQ(seed.tp, (std::vector<int>{4, 5}));
  EXPECT_EQ(seed.cp, (std::vector<int>{5, 7}));
  EXPECT_EQ(seed.dp_shard, (std::vector<int>{1, 3, 5, 7}));  // dp_shard x cp, same t
  EXPECT_EQ(seed.dp_replicate, (std::vector<int>{5}));
  EXPECT_EQ(seed.ep, (std::vector<int>{1, 5}));         // shards 0 and 1 at c 0, t 1
  EXPECT_EQ(seed.expert_dp, (std::vector<int>{5, 7}));  // shard 1 over c, same t
}

std::string layout_error(int world, const ParallelConfig& p) {
  try {
    RankInfo info;
    info.world_size = world;
    make_device_mesh(info, p, 60);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "(no error)";
}

// The mesh's invariants, without config key names (validate_config names the keys, join_mesh the
// world-size rule: trainer_test.cpp).
TEST(DeviceMeshTest, LayoutErrorsComeBeforeAnyConnection) {
  // Rank 0 of a world of 4 would host the store: it fails at once instead.
  EXPECT_EQ(layout_error(4, degrees(1, 2, 1)),
            "mesh_layout: replicate x shard x cp x tp = 1 x 2 x 1 x 1 = 2 must equal the world "
            "size 4");
  EXPECT_EQ(layout_error(2, degrees(2, 2, 1)),
            "mesh_layout: replicate x shard x cp x tp = 2 x 2 x 1 x 1 = 4 must equal the world "
            "size 2");
  EXPECT_EQ(layout_error(4, degrees(1, 1, 1, 2, 1)),
            "mesh_layout: replicate x shard x cp x tp = 1 x 1 x 2 x 1 = 2 must equal the world "
            "size 4");
  EXPECT_EQ(layout_error(4, degrees(2, 2, 4)), "mesh_layout: ep 4 must divide the shard degree 2");
  EXPECT_EQ(layout_error(3, degrees(1, 3, 2)), "mesh_layout: ep 2 must divide the shard degree 3");
  EXPECT_EQ(layout_error(1, degrees(0, 1, 1)),
            "mesh_layout: degrees must be >= 1, got replicate 0, shard 1, ep 1, cp 1, tp 1");
  EXPECT_EQ(layout_error(1, degrees(1, 1, 1, 1, 0)),
            "mesh_layout: degrees must be >= 1, got replicate 1, shard 1, ep 1, cp 1, tp 0");
  RankInfo info;
  info.world_size = 2;
  EXPECT_THROW(make_device_mesh(info, degrees(1, 2, 1), 0), std::invalid_argument);
}

TEST(DeviceMeshTest, SingleProcessMeshIsLocal) {
  const DeviceMesh mesh = make_single_process_mesh();
  for (const auto& group : {mesh.world, mesh.dp_shard_group, mesh.dp_replicate_group, mesh.ep_group,
                            mesh.expert_dp_group, mesh.cp_group, mesh.tp_group}) {
    EXPECT_EQ(group->size(), 1);
    EXPECT_EQ(group->rank(), 0);
  }
  EXPECT_EQ(mesh.dp_shard_group->name(), "dp_shard");
  // The training groups count into mesh.counters, background apart.
  for (const auto& group : {mesh.world, mesh.dp_shard_group, mesh.dp_replicate_group, mesh.ep_group,
                            mesh.expert_dp_group, mesh.cp_group, mesh.tp_group}) {
    group->barrier();
  }
  mesh.background->barrier();
  EXPECT_EQ(mesh.counters->snapshot()[CollectiveOp::kBarrier].calls, 7);
  EXPECT_EQ(mesh.background->counters()->snapshot()[CollectiveOp::kBarrier].calls, 1);
  RankInfo one;
  const DeviceMesh joined = make_device_mesh(one, degrees(1, 1, 1), 60);  // no store for 1 rank
  EXPECT_EQ(joined.world->size(), 1);
  EXPECT_EQ(joined.device, c10::Device(c10::kCPU));
}

// The mesh carries the rank's device. One rank needs no communicator, so a CUDA device is only
// recorded here (no GPU is touched): every group stays the local identity.
TEST(DeviceMeshTest, MeshCarriesTheRanksDevice) {
  const c10::Device cuda(c10::kCUDA, 0);
  EXPECT_EQ(make_single_process_mesh(cuda).device, cuda);
  RankInfo one;
  const DeviceMesh mesh = make_device_mesh(one, degrees(1, 1, 1), 60, cuda);
  EXPECT_EQ(mesh.device, cuda);
  for (const auto& group : {mesh.world, mesh.dp_shard_group, mesh.dp_replicate_group, mesh.ep_group,
                            mesh.expert_dp_group, mesh.cp_group, mesh.tp_group, mesh.background}) {
    EXPECT_EQ(group->size(), 1);
  }
}

// Each group all-gathers its members' world ranks: the real membership, in group-rank order.
void check_groups(const testing::WorkerEnv& worker, const ParallelConfig& p) {
  const int rank = worker.rank.rank;
  RankInfo info = worker.rank;
  const DeviceMesh mesh = make_device_mesh(info, p, worker.timeout_s);
  EXPECT_EQ(
      ((mesh.replicate_index() * p.dp_shard + mesh.shard_index()) * p.cp + mesh.cp_index()) * p.tp +
          mesh.tp_index(),
      rank);
  EXPECT_EQ(mesh.data_rank(), mesh.replicate_index() * p.dp_shard + mesh.shard_index());
  const std::pair<std::string, std::shared_ptr<Collectives>> groups[] = {
      {"dp_shard", mesh.dp_shard_group},
      {"dp_replicate", mesh.dp_replicate_group},
      {"ep", mesh.ep_group},
      {"expert_dp", mesh.expert_dp_group},
      {"cp", mesh.cp_group},
      {"tp", mesh.tp_group}};
  for (const auto& [kind, group] : groups) {
    SCOPED_TRACE(kind + " ep " + std::to_string(p.ep) + " rank " + std::to_string(rank));
    EXPECT_EQ(group->name(), kind);
    const at::Tensor members = group->all_gather(at::full({1}, int64_t{rank}, at::kLong));
    const std::vector<int64_t> got(members.data_ptr<int64_t>(),
                                   members.data_ptr<int64_t>() + members.numel());
    std::vector<int64_t> want;
    for (int r : expected_members(kind, rank, p)) want.push_back(r);
    EXPECT_EQ(got, want);
  }
  // The mesh's counters hold every training group's calls (the six all_gathers above) and
  // calls made on another thread (as CUDA autograd's backward worker makes them), not
  // background's.
  EXPECT_EQ(mesh.counters->snapshot()[CollectiveOp::kAllGather].calls, 6);
  std::thread([&] {
    mesh.world->barrier();
    mesh.dp_shard_group->barrier();
  }).join();
  mesh.background->barrier();
  EXPECT_EQ(mesh.counters->snapshot()[CollectiveOp::kBarrier].calls, 2);
  EXPECT_EQ(mesh.background->counters()->snapshot()[CollectiveOp::kBarrier].calls, 1);
  mesh.world->barrier();
}

MIXTRAIN_WORKER(mesh_groups) {
  if (worker.rank.world_size == 2) {
    check_groups(worker, degrees(1, 2, 1));
    return;
  }
  // Several meshes in one job, built in the same order on every rank.
  check_groups(worker, degrees(2, 2, 1));
  check_groups(worker, degrees(1, 4, 2));
  check_groups(worker, degrees(2, 2, 2));
  check_groups(worker, degrees(1, 1, 1, 2, 2));  // cp 2 x tp 2
  check_groups(worker, degrees(1, 2, 2, 1, 2));  // dp_shard 2 x tp 2, ep 2
}

TEST(DeviceMeshTest, GlooGroupsHaveTheFormulaMembers) {
  const WorkerResult two = run_workers("mesh_groups", 2, degrees(1, 2, 1));
  EXPECT_TRUE(two.all_ok()) << two.summary();
  const WorkerResult four = run_workers("mesh_groups", 4, degrees(2, 2, 1));
  EXPECT_TRUE(four.all_ok()) << four.summary();
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
