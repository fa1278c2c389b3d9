// The swap optimizer on one rank changes nothing (tools/swap_optimizer_check.h), and resuming
// with it from a checkpoint saved without it continues like resuming without.
#include <gtest/gtest.h>

#include "tools/swap_optimizer_check.h"

namespace mixtrain::testing {
namespace MIXTRAIN_FILE_LOCAL {

TEST(SwapOptimizer, OneRankTrainsAndResumesIdentically) {
  expect_swap_changes_nothing("1", /*resume=*/true);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain::testing
