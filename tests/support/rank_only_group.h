// A Collectives that only knows its rank and size: for tests of code that reads a group's
// position (ParamPlacement's box arithmetic, muon_sharding_of) and must never communicate.
// Every collective throws std::logic_error.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "mixtrain/core/collectives.h"

namespace mixtrain::test_support {

class RankOnlyGroup : public Collectives {
 public:
  RankOnlyGroup(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "tp"; }
  void all_reduce(at::Tensor&, ReduceOp) override { unused(); }
  at::Tensor all_gather(const at::Tensor&) override { unused(); }
  at::Tensor reduce_scatter_sum(const at::Tensor&) override { unused(); }
  at::Tensor all_to_all(const at::Tensor&, const std::vector<int64_t>&,
                        const std::vector<int64_t>&) override {
    unused();
  }
  void broadcast(at::Tensor&, int) override { unused(); }
  void barrier() override { unused(); }

 private:
  [[noreturn]] static void unused() { throw std::logic_error("no collective expected"); }
  int rank_, size_;
};

}  // namespace mixtrain::test_support
