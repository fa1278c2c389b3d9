// Mesh group membership against the row-major formula r = replicate_index * dp_shard +
// shard_index, both as a pure layout and on real Gloo groups (each group all-gathers its
// members' world ranks); the layout errors raised before any connection.
#include "mixtrain/distributed/device_mesh.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

#include "support/multiprocess.h"

namespace mixtrain {
namespace {

using testing::run_workers;
using testing::WorkerResult;

ParallelConfig degrees(int64_t replicate, int64_t shard, int64_t ep) {
  ParallelConfig parallel;
  parallel.dp_replicate = replicate;
  parallel.dp_shard = shard;
  parallel.ep = ep;
  return parallel;
}

// The groups written out from the definition, by brute force over all ranks.
std::vector<int> expected_members(const std::string& kind, int rank, const ParallelConfig& p) {
  const int64_t S = p.dp_shard;
  const int64_t E = p.ep;
  auto row = [&](int r) { return r / S; };
  auto column = [&](int r) { return r % S; };
  std::vector<int> members;
  for (int r = 0; r < p.dp_replicate * S; ++r) {
    bool same = true;
    if (kind == "dp_shard") same = row(r) == row(rank);
    if (kind == "dp_replicate") same = column(r) == column(rank);
    if (kind == "ep") same = row(r) == row(rank) && column(r) / E == column(rank) / E;
    if (kind == "expert_dp") same = column(r) % E == column(rank) % E;
    if (same) members.push_back(r);
  }
  return members;
}

const ParallelConfig kLayouts[] = {degrees(1, 2, 1), degrees(2, 2, 1), degrees(1, 4, 2),
                                   degrees(2, 2, 2)};

TEST(DeviceMeshTest, LayoutMatchesTheRowMajorFormula) {
  for (const ParallelConfig& p : kLayouts) {
    const int world = static_cast<int>(p.dp_replicate * p.dp_shard);
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(std::to_string(p.dp_replicate) + "x" + std::to_string(p.dp_shard) + " ep " +
                   std::to_string(p.ep) + " rank " + std::to_string(rank));
      const MeshLayout layout = mesh_layout(rank, world, p);
      EXPECT_EQ(layout.world.size(), static_cast<size_t>(world));
      EXPECT_EQ(layout.dp_shard, expected_members("dp_shard", rank, p));
      EXPECT_EQ(layout.dp_replicate, expected_members("dp_replicate", rank, p));
      EXPECT_EQ(layout.ep, expected_members("ep", rank, p));
      EXPECT_EQ(layout.expert_dp, expected_members("expert_dp", rank, p));
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
            "mesh_layout: replicate x shard = 1 x 2 = 2 must equal the world size 4");
  EXPECT_EQ(layout_error(2, degrees(2, 2, 1)),
            "mesh_layout: replicate x shard = 2 x 2 = 4 must equal the world size 2");
  EXPECT_EQ(layout_error(4, degrees(2, 2, 4)), "mesh_layout: ep 4 must divide the shard degree 2");
  EXPECT_EQ(layout_error(3, degrees(1, 3, 2)), "mesh_layout: ep 2 must divide the shard degree 3");
  EXPECT_EQ(layout_error(1, degrees(0, 1, 1)),
            "mesh_layout: degrees must be >= 1, got replicate 0, shard 1, ep 1");
  RankInfo info;
  info.world_size = 2;
  EXPECT_THROW(make_device_mesh(info, degrees(1, 2, 1), 0), std::invalid_argument);
}

TEST(DeviceMeshTest, SingleProcessMeshIsLocal) {
  const DeviceMesh mesh = make_single_process_mesh();
  for (const auto& group : {mesh.world, mesh.dp_shard_group, mesh.dp_replicate_group, mesh.ep_group,
                            mesh.expert_dp_group}) {
    EXPECT_EQ(group->size(), 1);
    EXPECT_EQ(group->rank(), 0);
  }
  EXPECT_EQ(mesh.dp_shard_group->name(), "dp_shard");
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
                            mesh.expert_dp_group, mesh.background}) {
    EXPECT_EQ(group->size(), 1);
  }
}

// Each group all-gathers its members' world ranks: the real membership, in group-rank order.
void check_groups(const testing::WorkerEnv& worker, const ParallelConfig& p) {
  const int rank = worker.rank.rank;
  RankInfo info = worker.rank;
  const DeviceMesh mesh = make_device_mesh(info, p, worker.timeout_s);
  EXPECT_EQ(mesh.replicate_index() * p.dp_shard + mesh.shard_index(), rank);
  const std::pair<std::string, std::shared_ptr<Collectives>> groups[] = {
      {"dp_shard", mesh.dp_shard_group},
      {"dp_replicate", mesh.dp_replicate_group},
      {"ep", mesh.ep_group},
      {"expert_dp", mesh.expert_dp_group}};
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
  mesh.world->barrier();
}

MIXTRAIN_WORKER(mesh_groups) {
  if (worker.rank.world_size == 2) {
    check_groups(worker, degrees(1, 2, 1));
    return;
  }
  // Three meshes in one job, built in the same order on every rank.
  check_groups(worker, degrees(2, 2, 1));
  check_groups(worker, degrees(1, 4, 2));
  check_groups(worker, degrees(2, 2, 2));
}

TEST(DeviceMeshTest, GlooGroupsHaveTheFormulaMembers) {
  const WorkerResult two = run_workers("mesh_groups", 2, degrees(1, 2, 1));
  EXPECT_TRUE(two.all_ok()) << two.summary();
  const WorkerResult four = run_workers("mesh_groups", 4, degrees(2, 2, 1));
  EXPECT_TRUE(four.all_ok()) << four.summary();
}

}  // namespace
}  // namespace mixtrain
