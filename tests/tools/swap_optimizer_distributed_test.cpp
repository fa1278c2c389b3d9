// The swap optimizer on two FSDP ranks (distributed Muon) changes nothing
// (tools/swap_optimizer_check.h).
#include <gtest/gtest.h>

#include "tools/swap_optimizer_check.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

TEST(SwapOptimizer, TwoRanksTrainIdentically) {
  expect_swap_changes_nothing("2");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
