#include "mixtrain/distributed/collective_checks.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

std::string error_of(const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                     const at::Tensor& input) {
  try {
    check_all_to_all("ep", 1, 3, input, send, recv);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

// Rank 1 of 3 sends rows [0,2) to rank 0, keeps [2,3), sends [3,7) to rank 2: 6 rows of
// 4 x 5 float32 (80 bytes each) leave it; it receives 1 + 2 + 3 rows.
TEST(CollectiveChecks, AllToAllResultShapeAndSentBytes) {
  const at::Tensor input = at::zeros({7, 4, 5});
  const AllToAllShape shape = check_all_to_all("ep", 1, 3, input, {2, 1, 4}, {1, 2, 3});
  EXPECT_EQ(shape.result, (std::vector<int64_t>{6, 4, 5}));
  EXPECT_EQ(shape.sent_bytes, 6 * 80);
}

TEST(CollectiveChecks, AllToAllRefusesBadCounts) {
  const at::Tensor input = at::zeros({3, 2});
  EXPECT_EQ(error_of({1, 2}, {1, 1, 1}, input),
            "ep: all_to_all needs one send and one receive count per rank (3)");
  EXPECT_EQ(error_of({1, -1, 3}, {1, 1, 1}, input), "ep: all_to_all counts must be >= 0");
  EXPECT_EQ(error_of({1, 1, 2}, {1, 1, 1}, input),
            "ep: all_to_all send counts sum to 4 but the input has 3 rows");
  EXPECT_EQ(error_of({0, 0, 0}, {0, 0, 0}, at::zeros({})),
            "ep: all_to_all send counts sum to 0 but the input has 0 rows");
}

TEST(CollectiveChecks, FirstLineDropsTheBacktrace) {
  EXPECT_EQ(first_line(std::runtime_error("peer gone\nmore")), "peer gone");
  try {
    TORCH_CHECK(false, "Connection closed by peer");
  } catch (const c10::Error& error) {
    EXPECT_EQ(first_line(error), "Connection closed by peer");
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(CollectiveChecks, PayloadDtypesAreTheContractsOnly) {
  for (at::ScalarType type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kByte,
                              at::kChar, at::kInt, at::kLong}) {
    EXPECT_NO_THROW(check_payload_dtype("dp_shard", "all_gather", type)) << type;
  }
  try {
    check_payload_dtype("dp_shard", "all_gather", at::kBool);
    FAIL() << "bool accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_STREQ(error.what(), "dp_shard: all_gather does not support dtype Bool");
  }
}

TEST(CollectiveChecks, BroadcastIsChargedToItsRootAndRefusesAnOutOfRangeRoot) {
  // 4 ranks, root 1, 100 bytes: the root sends its tensor to 3 peers, the others send nothing.
  EXPECT_EQ(check_broadcast("world", 1, 4, 1, 100), 300);
  EXPECT_EQ(check_broadcast("world", 0, 4, 1, 100), 0);
  EXPECT_EQ(check_broadcast("world", 3, 4, 1, 100), 0);
  for (int root : {-1, 4}) {
    try {
      check_broadcast("world", 0, 4, root, 100);
      FAIL() << "root " << root << " accepted";
    } catch (const std::invalid_argument& error) {
      EXPECT_EQ(std::string(error.what()),
                "world: broadcast root " + std::to_string(root) + " out of range");
    }
  }
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
