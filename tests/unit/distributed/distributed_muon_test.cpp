// Distributed Muon over real processes and Gloo (tests/support/multiprocess.h): the FSDP
// owner-per-bucket path over dp_shard, the DDP path over dp_replicate, both at once in a 2 x 2
// HSDP mesh. Every rank also runs single-process Muon on the full parameters with the full
// gradients and compares its own shard (FSDP) or replica (DDP) with it.
//
// Bitwise where the in-process test (tests/unit/optim/distributed_muon_test.cpp) explains why:
// float32 params, Newton–Schulz in bfloat16 (wire bfloat16, which Gloo carries as its bits) or
// float32 over a float32 wire, shapes whose Gram matrices exceed 16 x 16 or are alone in their
// shape. float32 Newton–Schulz over a bfloat16 wire: within kBf16WireTolerance, derived there.
//
// Tensor parallelism (tp 2; tp 2 x dp_shard 2; tp 2 x dp_replicate 2): the same parameters
// with tp_dim 0, 1 or -1 (kTpDims), placed through ParamPlacement / muon_sharding_of (kWhole
// with a tp split on the one-data-rank mesh, kDim0Shard of the tp slice over dp_shard, or
// kReplicated over dp_replicate); each rank's box (global_offsets / local_sizes) of the
// single-process update on the whole tensors. The whole u is gathered exactly (concatenation of
// elementwise momentum slices), so Newton–Schulz sees the reference's matrix: bitwise under the
// same conditions as above, kBf16WireTolerance for float32 Newton–Schulz over a bfloat16 wire
// (u and O each rounded once to bfloat16, as on the FSDP path). With NorMuon and cautious
// weight decay (float32 Newton-Schulz and wire) every layout is bitwise too: v's rows are
// gathered like u's (a row split) or whole on every tp rank (a column split).
// muon_sharding_of's tp mapping
// and its refusals (an expert slice or a 3-D parameter with a tp split) in one process.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/param_placement.h"
#include "mixtrain/distributed/device_mesh.h"
#include "mixtrain/optim/distributed_muon.h"
#include "mixtrain/optim/muon.h"
#include "support/multiprocess.h"
#include "support/rank_only_group.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

using torch::optim::OptimizerParamGroup;

at::Tensor random_normal(at::IntArrayRef shape, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen, at::kFloat);
}

at::Tensor dim0_chunk(const at::Tensor& full, int rank, int n) {
  const auto rows = fsdp_chunk_rows(full.size(0), n);
  int64_t start = 0;
  for (int r = 0; r < rank; ++r) start += rows[r];
  return full.narrow(0, start, rows[rank]).clone();
}

struct NamedShape {
  std::string name;
  std::vector<int64_t> shape;
};

// Uneven chunks (37 rows), ranks without rows at 4 (9 and 5 rows), one same-shape batch of
// three in the reference, tall and wide; seven params, so the last bucket is partial at 2 and 4.
// The 3-D expert tensor takes the local path.
const std::vector<NamedShape> kShapes = {
    {"layers.0.q", {64, 48}},  {"layers.0.k", {37, 29}},    {"layers.1.q", {64, 48}},
    {"layers.0.o", {9, 40}},   {"layers.1.o", {5, 24}},     {"layers.2.q", {64, 48}},
    {"layers.0.up", {96, 40}}, {"experts.up", {4, 24, 32}},
};
// The tp split of each kShapes entry: column (0) and row (1) parallel matrices, matrices whole
// on every tp rank (-1, the odd 37 x 29 among them) and the expert tensor (never tp-split).
const std::vector<int64_t> kTpDims = {0, -1, 1, 1, 1, -1, 0, -1};
constexpr int kSteps = 3;
constexpr double kBf16WireTolerance = 3 * 0.039 * 1.2 / 256;

// One parameter's distributed update against the single-process one: bitwise where the wire
// carries what Newton–Schulz reads, else within kBf16WireTolerance; a difference is reported.
void expect_update(const at::Tensor& got, const at::Tensor& expected, bool bitwise,
                   const std::string& what, std::ostringstream& report) {
  EXPECT_EQ(got.sizes(), expected.sizes()) << what;
  if (got.sizes() != expected.sizes() || got.numel() == 0) return;
  const double diff = (got.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
  if (bitwise) {
    EXPECT_TRUE(at::equal(got, expected)) << what << ": max diff " << diff;
  } else {
    EXPECT_LT(diff, kBf16WireTolerance) << what;
  }
  if (diff != 0.0) report << what << " max diff " << diff << "\n";
}

MuonOptions options_for(at::ScalarType ns_dtype, at::ScalarType wire) {
  return MuonOptions().lr(0.02).weight_decay(0.1).ns_dtype(ns_dtype).communication_dtype(wire);
}

// Two groups (the second with its own lr and weight decay), as build_optimizer makes them.
std::unique_ptr<Muon> make_muon(const std::vector<at::Tensor>& params, const MuonOptions& options) {
  const size_t half = params.size() / 2;
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>(params.begin(), params.begin() + half));
  MuonOptions second = options;
  second.lr(options.lr() * 0.5).weight_decay(0.2);
  groups.emplace_back(std::vector<at::Tensor>(params.begin() + half, params.end()),
                      std::make_unique<MuonOptions>(second));
  return std::make_unique<Muon>(std::move(groups), options);
}

std::vector<at::Tensor> run(const MuonOptions& options, MuonSharding::Kind kind,
                            const std::shared_ptr<Collectives>& group) {
  const int n = group ? group->size() : 1;
  const int rank = group ? group->rank() : 0;
  auto hold = [&](const at::Tensor& full) {
    return kind == MuonSharding::Kind::kFsdp ? dim0_chunk(full, rank, n) : full;
  };
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    params.push_back(hold(random_normal(kShapes[i].shape, 100 + i)));
  }
  auto muon = make_muon(params, options);
  if (kind != MuonSharding::Kind::kLocal) {
    for (size_t i = 0; i < kShapes.size(); ++i) {
      muon->set_sharding(params[i], {kind, kShapes[i].shape, group, kShapes[i].name});
    }
  }
  for (int step = 1; step <= kSteps; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = hold(random_normal(kShapes[i].shape, 1000 * step + i));
    }
    muon->step();
  }
  return params;
}

struct Combo {
  at::ScalarType ns_dtype;
  at::ScalarType wire;
  bool bitwise;
  bool normuon = false;  // with NorMuon and cautious weight decay
};
// NorMuon: the owner normalizes the whole matrix (tp slices and dp shards of u and of v's rows
// gathered), so the result is the reference's bit for bit.
const std::vector<Combo> kCombos = {
    {at::kBFloat16, at::kBFloat16, true},
    {at::kFloat, at::kFloat, true},
    {at::kFloat, at::kBFloat16, false},
    {at::kFloat, at::kFloat, true, true},
};

// Compares `got` (this rank's shard or replica) with the reference; returns one line per
// mismatch for the report.
std::string compare(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& reference,
                    MuonSharding::Kind kind, const Collectives& group, const Combo& combo,
                    const std::string& label) {
  std::ostringstream report;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const at::Tensor expected = kind == MuonSharding::Kind::kFsdp
                                    ? dim0_chunk(reference[i], group.rank(), group.size())
                                    : reference[i];
    const std::string what = label + (combo.normuon ? " normuon " : " ") +
                             c10::toString(combo.ns_dtype) + "/" + c10::toString(combo.wire) + " " +
                             kShapes[i].name;
    expect_update(got[i], expected, combo.bitwise, what, report);
  }
  return report.str();
}

MIXTRAIN_WORKER(distributed_muon_paths) {
  DeviceMesh mesh = worker.make_mesh();
  std::ostringstream report;
  for (const auto& combo : kCombos) {
    const MuonOptions options = options_for(combo.ns_dtype, combo.wire)
                                    .normuon(combo.normuon)
                                    .cautious_weight_decay(combo.normuon);
    const auto reference = run(options, MuonSharding::Kind::kLocal, nullptr);
    if (mesh.dp_shard > 1) {
      const auto got = run(options, MuonSharding::Kind::kFsdp, mesh.dp_shard_group);
      report << "ran fsdp\n"
             << compare(got, reference, MuonSharding::Kind::kFsdp, *mesh.dp_shard_group, combo,
                        "fsdp");
    }
    if (mesh.dp_replicate > 1) {
      const auto got = run(options, MuonSharding::Kind::kReplicated, mesh.dp_replicate_group);
      report << "ran ddp\n"
             << compare(got, reference, MuonSharding::Kind::kReplicated, *mesh.dp_replicate_group,
                        combo, "ddp");
    }
  }
  worker.write_text("report_" + std::to_string(worker.rank.rank), report.str());
}

// This rank's placement of kShapes[i] on `mesh` with tp split kTpDims[i], held as `kind`
// (kWhole, kDim0Shard over dp_shard, kReplicated over dp_replicate).
ParamPlacement tp_placement(const DeviceMesh& mesh, size_t i, ParamPlacement::Kind kind) {
  ParamPlacement p = whole_placement(kShapes[i].name, kShapes[i].shape);
  p.kind = kind;
  p.tp_dim = kTpDims[i];
  p.tp_group = mesh.tp_group;
  const int64_t dim0 = p.tp_shape()[0];
  p.rows = dim0;
  if (kind == ParamPlacement::Kind::kDim0Shard) {
    const int n = mesh.dp_shard_group->size();
    const auto rows = fsdp_chunk_rows(dim0, n);
    p.offset = 0;
    for (int r = 0; r < mesh.dp_shard_group->rank(); ++r) p.offset += rows[r];
    p.rows = rows[mesh.dp_shard_group->rank()];
    p.shard_group = mesh.dp_shard_group;
    p.replicate_group = mesh.dp_replicate_group;
  } else if (kind == ParamPlacement::Kind::kReplicated) {
    p.replicate_group = mesh.dp_replicate_group;
  }
  return p;
}

at::Tensor box_of(const at::Tensor& full, const ParamPlacement& placement) {
  at::Tensor box = full;
  const auto offsets = placement.global_offsets();
  const auto sizes = placement.local_sizes();
  for (size_t d = 0; d < sizes.size(); ++d) box = box.narrow(d, offsets[d], sizes[d]);
  return box.clone();
}

std::vector<at::Tensor> run_placed(const MuonOptions& options,
                                   const std::vector<ParamPlacement>& placements) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    params.push_back(box_of(random_normal(kShapes[i].shape, 100 + i), placements[i]));
  }
  auto muon = make_muon(params, options);
  for (size_t i = 0; i < kShapes.size(); ++i) muon->set_placement(params[i], placements[i]);
  for (int step = 1; step <= kSteps; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() =
          box_of(random_normal(kShapes[i].shape, 1000 * step + i), placements[i]);
    }
    muon->step();
  }
  return params;
}

MIXTRAIN_WORKER(distributed_muon_tp) {
  DeviceMesh mesh = worker.make_mesh();
  std::vector<std::pair<std::string, ParamPlacement::Kind>> kinds;
  if (mesh.dp_shard > 1) kinds.emplace_back("fsdp", ParamPlacement::Kind::kDim0Shard);
  if (mesh.dp_replicate > 1) kinds.emplace_back("ddp", ParamPlacement::Kind::kReplicated);
  if (kinds.empty()) kinds.emplace_back("whole", ParamPlacement::Kind::kWhole);
  std::ostringstream report;
  for (const auto& combo : kCombos) {
    const MuonOptions options = options_for(combo.ns_dtype, combo.wire)
                                    .normuon(combo.normuon)
                                    .cautious_weight_decay(combo.normuon);
    const auto reference = run(options, MuonSharding::Kind::kLocal, nullptr);
    for (const auto& [label, kind] : kinds) {
      std::vector<ParamPlacement> placements;
      for (size_t i = 0; i < kShapes.size(); ++i) placements.push_back(tp_placement(mesh, i, kind));
      const auto got = run_placed(options, placements);
      report << "ran " << label << "\n";
      for (size_t i = 0; i < kShapes.size(); ++i) {
        const at::Tensor expected = box_of(reference[i], placements[i]);
        const std::string what = label + (combo.normuon ? " normuon " : " ") +
                                 c10::toString(combo.ns_dtype) + "/" + c10::toString(combo.wire) +
                                 " " + kShapes[i].name;
        expect_update(got[i], expected, combo.bitwise, what, report);
      }
    }
  }
  worker.write_text("report_" + std::to_string(worker.rank.rank), report.str());
}

// Rank 1 has no grad for one parameter: every rank fails with the same clear message instead
// of pairing mismatched shards or waiting for the collective timeout.
MIXTRAIN_WORKER(distributed_muon_mismatch) {
  DeviceMesh mesh = worker.make_mesh();
  at::Tensor a = at::ones({4, 8});
  at::Tensor b = at::ones({4, 8});
  Muon muon(std::vector<at::Tensor>{a, b}, MuonOptions());
  muon.set_sharding(a, {MuonSharding::Kind::kFsdp, {8, 8}, mesh.dp_shard_group, "a"});
  muon.set_sharding(b, {MuonSharding::Kind::kFsdp, {8, 8}, mesh.dp_shard_group, "b"});
  a.mutable_grad() = at::ones({4, 8});
  if (worker.rank.rank == 0) b.mutable_grad() = at::ones({4, 8});
  muon.step();  // throws on every rank
}

struct MeshCase {
  int nproc;
  int64_t dp_replicate;
  int64_t dp_shard;
  int64_t tp = 1;
};

void run_case(const MeshCase& c) {
  ParallelConfig parallel;
  parallel.dp_replicate = c.dp_replicate;
  parallel.dp_shard = c.dp_shard;
  parallel.tp = c.tp;
  const char* worker = c.tp > 1 ? "distributed_muon_tp" : "distributed_muon_paths";
  const auto result = testing::run_workers(worker, c.nproc, parallel, {}, 60);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  for (int r = 0; r < c.nproc; ++r) {
    const std::string report = result.read_text("report_" + std::to_string(r));
    // Each path ran once per combo; only the bfloat16-wire float32 Newton–Schulz runs may
    // differ (within tolerance).
    int fsdp_runs = 0, ddp_runs = 0, whole_runs = 0;
    std::istringstream lines(report);
    for (std::string line; std::getline(lines, line);) {
      if (line == "ran fsdp") {
        ++fsdp_runs;
      } else if (line == "ran ddp") {
        ++ddp_runs;
      } else if (line == "ran whole") {
        ++whole_runs;
      } else {
        EXPECT_NE(line.find("Float/BFloat16"), std::string::npos) << "rank " << r << ": " << line;
      }
    }
    const int combos = static_cast<int>(kCombos.size());
    EXPECT_EQ(fsdp_runs, c.dp_shard > 1 ? combos : 0) << "rank " << r;
    EXPECT_EQ(ddp_runs, c.dp_replicate > 1 ? combos : 0) << "rank " << r;
    EXPECT_EQ(whole_runs, c.dp_shard * c.dp_replicate == 1 ? combos : 0) << "rank " << r;
  }
}

TEST(DistributedMuonMultiProcessTest, FsdpTwoRanks) {
  run_case({2, 1, 2});
}
TEST(DistributedMuonMultiProcessTest, FsdpFourRanks) {
  run_case({4, 1, 4});
}
TEST(DistributedMuonMultiProcessTest, DdpTwoRanks) {
  run_case({2, 2, 1});
}
TEST(DistributedMuonMultiProcessTest, DdpFourRanks) {
  run_case({4, 4, 1});
}
TEST(DistributedMuonMultiProcessTest, HsdpTwoByTwoFsdpAndDdp) {
  run_case({4, 2, 2});
}

TEST(DistributedMuonMultiProcessTest, TensorParallelTwoRanksWholeMatrices) {
  run_case({2, 1, 1, 2});
}
TEST(DistributedMuonMultiProcessTest, TensorParallelTwoByFsdpTwo) {
  run_case({4, 1, 2, 2});
}
TEST(DistributedMuonMultiProcessTest, TensorParallelTwoByDdpTwo) {
  run_case({4, 2, 1, 2});
}

using test_support::RankOnlyGroup;

TEST(DistributedMuonTensorParallel, PlacementMappingAndRefusals) {
  const auto tp = std::make_shared<RankOnlyGroup>(1, 2);
  ParamPlacement whole = whole_placement("w", {8, 6});
  whole.tp_dim = 1;
  whole.tp_group = tp;
  const MuonSharding mapped = muon_sharding_of(whole);
  EXPECT_EQ(mapped.kind, MuonSharding::Kind::kReplicated);  // one-rank DDP gathers the slices
  ASSERT_TRUE(mapped.group);
  EXPECT_EQ(mapped.group->size(), 1);
  EXPECT_EQ(mapped.whole_shape({8, 3}), (std::vector<int64_t>{8, 6}));

  ParamPlacement dim0 = whole;
  dim0.kind = ParamPlacement::Kind::kDim0Shard;
  dim0.shard_group = tp;  // any 2-rank group: rows of the [8, 3] tp slice
  dim0.rows = 4;
  const MuonSharding fsdp = muon_sharding_of(dim0);
  EXPECT_EQ(fsdp.full_shape, (std::vector<int64_t>{8, 3}));  // the tp slice the shards make

  ParamPlacement experts = whole_placement("experts.up", {4, 6, 8});
  experts.kind = ParamPlacement::Kind::kExpertSlice;
  experts.tp_dim = 1;
  experts.tp_group = tp;
  EXPECT_THROW(muon_sharding_of(experts), std::invalid_argument);

  at::Tensor cube = at::zeros({2, 3, 8});
  Muon muon(std::vector<at::Tensor>{cube}, MuonOptions());
  MuonSharding split{MuonSharding::Kind::kReplicated, {}, tp, "cube", 1, tp};
  EXPECT_THROW(muon.set_sharding(cube, split), std::invalid_argument);  // 3-D: never tp-split
}

TEST(DistributedMuonMultiProcessTest, RanksSteppingDifferentParamsFailClearly) {
  ParallelConfig parallel;
  parallel.dp_shard = 2;
  const auto result = testing::run_workers("distributed_muon_mismatch", 2, parallel, {}, 30);
  ASSERT_EQ(result.ranks.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_FALSE(result.ranks[r].ok()) << result.summary();
    EXPECT_NE(result.outputs[r].find("ranks step different parameters"), std::string::npos)
        << result.summary();
  }
  EXPECT_LT(result.seconds, 30.0) << "a mismatch must not wait for the collective timeout";
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
