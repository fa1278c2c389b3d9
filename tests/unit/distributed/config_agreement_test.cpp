// check_config_agreement on 3 real ranks: equal texts pass; a rank with a different text makes
// every rank refuse, naming that rank and the first differing line.
#include "mixtrain/distributed/config_agreement.h"

#include <gtest/gtest.h>

#include "mixtrain/core/error.h"
#include "support/multiprocess.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

MIXTRAIN_WORKER(agreement) {
  const DeviceMesh mesh = worker.make_mesh();
  const int rank = worker.rank.rank;
  const std::string same = "model.name  qwen2_moe  default\ntrain.steps  100  file\n";
  check_config_agreement(mesh, same);  // agrees: returns on every rank

  std::string mine = same;
  if (rank == 2) mine = "model.name  qwen2_moe  default\ntrain.steps  30  --set\n";
  try {
    check_config_agreement(mesh, mine);
    worker.write_text("error" + std::to_string(rank), "(no error)");
  } catch (const UserError& error) {
    worker.write_text("error" + std::to_string(rank), error.what());
  }
}

TEST(ConfigAgreementTest, DifferingRankIsRefusedOnEveryRank) {
  ParallelConfig parallel;
  parallel.dp_shard = 3;
  const testing::WorkerResult result = testing::run_workers("agreement", 3, parallel);
  ASSERT_TRUE(result.all_ok()) << result.summary();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(result.read_text("error" + std::to_string(r)),
              "config agreement: the resolved config of rank 2 differs from rank 0's (every rank "
              "must run the same config); first difference at line 2: rank 0 has 'train.steps  "
              "100  file', rank 2 has 'train.steps  30  --set'");
  }
}

TEST(ConfigAgreementTest, OneRankAlwaysAgrees) {
  check_config_agreement(make_single_process_mesh(), "anything");
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
