// The FLOP-balanced owner plan of distributed Muon; see muon_owner_plan.h.
#include "mixtrain/optim/muon_owner_plan.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace mixtrain {

int64_t newton_schulz_flops(int64_t rows, int64_t cols, int64_t steps) {
  if (rows < 0 || cols < 0 || steps < 0) {
    throw std::invalid_argument("newton_schulz_flops: negative size or steps");
  }
  const int64_t m = std::min(rows, cols);
  const int64_t n = std::max(rows, cols);
  return steps * (4 * m * m * n + 2 * m * m * m);
}

bool operator==(const MuonOwnerItem& a, const MuonOwnerItem& b) {
  return a.numel == b.numel && a.flops == b.flops && a.name == b.name;
}

const std::vector<MuonOwnerBucket>& MuonOwnerPlanCache::plan(
    const std::vector<MuonOwnerItem>& items, int ranks, int64_t min_bucket_numel) {
  if (valid_ && ranks == ranks_ && min_bucket_numel == min_bucket_numel_ && items == items_) {
    return plan_;
  }
  plan_ = muon_owner_plan(items, ranks, min_bucket_numel);  // throws before the cache changes
  items_ = items;
  ranks_ = ranks;
  min_bucket_numel_ = min_bucket_numel;
  valid_ = true;
  ++plans_computed_;
  return plan_;
}

std::vector<MuonOwnerBucket> muon_owner_plan(const std::vector<MuonOwnerItem>& items, int ranks,
                                             int64_t min_bucket_numel) {
  if (ranks < 1) throw std::invalid_argument("muon_owner_plan: ranks must be >= 1");
  if (min_bucket_numel < 0) {
    throw std::invalid_argument("muon_owner_plan: min_bucket_numel must be >= 0");
  }
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].flops != items[b].flops) return items[a].flops > items[b].flops;
    if (items[a].name != items[b].name) return items[a].name < items[b].name;
    return items[a].numel > items[b].numel;  // equal names (tests): still one order everywhere
  });
  int64_t bucket_numel = min_bucket_numel;
  for (const auto& item : items) bucket_numel = std::max(bucket_numel, item.numel);

  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);       // FLOPs, whole step
  std::vector<int64_t> in_bucket(static_cast<size_t>(ranks), 0);  // numel, current bucket
  std::vector<MuonOwnerBucket> plan;
  for (size_t item : order) {
    const auto owner = static_cast<size_t>(std::min_element(load.begin(), load.end()) -
                                           load.begin());  // first minimum: lowest rank
    if (plan.empty() || in_bucket[owner] + items[item].numel > bucket_numel) {
      plan.emplace_back();
      std::fill(in_bucket.begin(), in_bucket.end(), 0);
    }
    plan.back().items.push_back(item);
    plan.back().owners.push_back(static_cast<int>(owner));
    load[owner] += items[item].flops;
    in_bucket[owner] += items[item].numel;
  }
  return plan;
}

MuonOwnerLoad muon_owner_load(const std::vector<MuonOwnerItem>& items,
                              const std::vector<MuonOwnerBucket>& plan, int ranks) {
  if (ranks < 1) throw std::invalid_argument("muon_owner_load: ranks must be >= 1");
  MuonOwnerLoad result;
  result.per_rank.assign(static_cast<size_t>(ranks), 0);
  double bucket_max_sum = 0.0;
  for (const auto& bucket : plan) {
    std::vector<int64_t> here(static_cast<size_t>(ranks), 0);
    for (size_t j = 0; j < bucket.items.size(); ++j) {
      here.at(static_cast<size_t>(bucket.owners[j])) += items.at(bucket.items[j]).flops;
    }
    for (int r = 0; r < ranks; ++r) result.per_rank[r] += here[r];
    bucket_max_sum += static_cast<double>(*std::max_element(here.begin(), here.end()));
  }
  const double total = static_cast<double>(
      std::accumulate(result.per_rank.begin(), result.per_rank.end(), int64_t{0}));
  if (total > 0) {
    const double mean = total / ranks;
    result.max_over_mean =
        static_cast<double>(*std::max_element(result.per_rank.begin(), result.per_rank.end())) /
        mean;
    result.bucket_max_sum_over_mean = bucket_max_sum / mean;
  }
  return result;
}

}  // namespace mixtrain
