// Which rank orthogonalizes which matrix on distributed Muon's communicating paths
// (distributed_muon.h, docs/architecture.md §7): a plan every rank computes alone, from the
// same inputs, so no plan is ever exchanged.
//
// Cost of a matrix: its Newton–Schulz FLOPs. For a rows x cols matrix with m = min(rows, cols),
// n = max (newton_schulz works on the wide orientation), each iteration is
//   A = X X^T   2 m^2 n      (m x n times n x m)
//   A A         2 m^3
//   B X         2 m^2 n      (B = b A + c A A, m x m times m x n)
// i.e. 4 m^2 n + 2 m^3, times ns_steps; the elementwise terms (m^2 and m n per iteration) and
// the normalization are left out.
//
// Plan (longest processing time first): items sorted by FLOPs descending, ties by name, then
// by index; each goes to the rank with the least FLOPs owned so far over the whole step
// (earlier buckets included), ties to the lowest rank. A rank may own several matrices of a
// bucket, or none. Buckets cut that sequence: an item opens a new bucket when its owner
// would otherwise assemble more than `bucket_numel` elements in the current one, with
// bucket_numel = max(the largest item's numel, min_bucket_numel). So no owner holds more than
// one largest matrix of assembled u per bucket when matrices are large (the round-robin
// buckets of one matrix per rank had the same bound), while small matrices share a bucket: a
// collective costs a fixed latency (Gloo on loopback: ~0.2 ms a call, bench/README.md
// muon_overlap), which buckets of at least kMuonOwnerMinBucketNumel elements (2 MiB of
// bfloat16 per owner) amortize. Peak per rank with the overlapped step: about three buckets'
// worth (k-1's update coming back, k's u being orthogonalized, k+1's u in flight).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain {

// 4 m^2 n + 2 m^3 per iteration (see above) times `steps`; rows, cols >= 0.
int64_t newton_schulz_flops(int64_t rows, int64_t cols, int64_t steps);

struct MuonOwnerItem {
  int64_t numel = 0;  // elements the owner assembles (what the bucket bound counts; NorMuon
                      // matrices: their v rows too)
  std::string name;   // breaks FLOP ties, so every rank orders the items alike
  int64_t flops = 0;  // its Newton–Schulz cost (newton_schulz_flops of the matrix it becomes)
};

bool operator==(const MuonOwnerItem& a, const MuonOwnerItem& b);

struct MuonOwnerBucket {
  std::vector<size_t> items;  // indices into the items, in plan order
  std::vector<int> owners;    // owners[j]: the rank that orthogonalizes items[j]
};

// The default smallest bucket bound: 2^20 elements per owner.
inline constexpr int64_t kMuonOwnerMinBucketNumel = int64_t{1} << 20;

// The plan above over `ranks` ranks (>= 1) with buckets bounded by max(largest numel,
// min_bucket_numel >= 0); std::invalid_argument otherwise. Deterministic: depends only on
// (flops, name, numel, index) of each item.
std::vector<MuonOwnerBucket> muon_owner_plan(const std::vector<MuonOwnerItem>& items, int ranks,
                                             int64_t min_bucket_numel = kMuonOwnerMinBucketNumel);

// muon_owner_plan of the last inputs, computed again only when they change: a distributed Muon
// step's items are its last step's unless a gradient went missing or an option changed.
class MuonOwnerPlanCache {
 public:
  const std::vector<MuonOwnerBucket>& plan(const std::vector<MuonOwnerItem>& items, int ranks,
                                           int64_t min_bucket_numel);
  int64_t plans_computed() const { return plans_computed_; }

 private:
  bool valid_ = false;
  std::vector<MuonOwnerItem> items_;
  int ranks_ = 0;
  int64_t min_bucket_numel_ = 0;
  std::vector<MuonOwnerBucket> plan_;
  int64_t plans_computed_ = 0;
};

// FLOPs each rank owns over the whole plan, and the two balance figures of bench/README.md:
// max / mean of the per-rank totals, and the sum over buckets of the busiest rank's FLOPs in
// that bucket over the mean (what the step would take if every bucket waited for its slowest
// owner, as a step without overlap does). 1.0 each when there is nothing to do.
struct MuonOwnerLoad {
  std::vector<int64_t> per_rank;
  double max_over_mean = 1.0;
  double bucket_max_sum_over_mean = 1.0;
};
MuonOwnerLoad muon_owner_load(const std::vector<MuonOwnerItem>& items,
                              const std::vector<MuonOwnerBucket>& plan, int ranks);

}  // namespace mixtrain
