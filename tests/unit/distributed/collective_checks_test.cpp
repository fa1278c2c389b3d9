#include "mixtrain/distributed/collective_checks.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

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

// The arithmetic a one-rank group never exercises (there every collective is the identity),
// for 2, 3 and 4 ranks, against shapes and byte counts written out by hand.
TEST(CollectiveChecks, AllGatherShapesForSeveralRanks) {
  const at::Tensor local = at::zeros({3, 5});  // 60 bytes
  for (int n : {1, 2, 3, 4}) {
    const AllGatherShape shape = all_gather_shape(local, n);
    EXPECT_EQ(shape.result, (std::vector<int64_t>{3 * n, 5})) << n;
    EXPECT_EQ(shape.block, (std::vector<int64_t>{3, 5})) << n;
    EXPECT_EQ(shape.sent_bytes, (n - 1) * 60) << n;
  }
  const AllGatherShape scalar = all_gather_shape(at::zeros({}, at::kDouble), 3);
  EXPECT_EQ(scalar.result, (std::vector<int64_t>{3}));
  EXPECT_EQ(scalar.block, (std::vector<int64_t>{1}));
  EXPECT_EQ(scalar.sent_bytes, 2 * 8);
  const AllGatherShape empty = all_gather_shape(at::zeros({0, 4}), 4);
  EXPECT_EQ(empty.result, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(empty.sent_bytes, 0);
}

TEST(CollectiveChecks, ReduceScatterShapesForSeveralRanks) {
  const at::Tensor full = at::zeros({12, 2});  // 96 bytes
  const std::vector<std::tuple<int, int64_t, int64_t>> cases = {
      {1, 12, 0}, {2, 6, 48}, {3, 4, 64}, {4, 3, 72}};  // ranks, rows, (n-1)/n x 96
  for (const auto& [n, rows, bytes] : cases) {
    const ReduceScatterShape shape = check_reduce_scatter("dp_shard", n, full, 96);
    EXPECT_EQ(shape.rows, rows) << n;
    EXPECT_EQ(shape.result, (std::vector<int64_t>{rows, 2})) << n;
    EXPECT_EQ(shape.sent_bytes, bytes) << n;
  }
  // float16 goes on the wire as float32 (NCCL): twice its own bytes are charged.
  const at::Tensor half = at::zeros({4}, at::kHalf);
  EXPECT_EQ(check_reduce_scatter("g", 2, half, 2 * 8).sent_bytes, 8);
}

TEST(CollectiveChecks, ReduceScatterRefusals) {
  auto error_of = [](int n, const at::Tensor& full) -> std::string {
    try {
      check_reduce_scatter("dp_shard", n, full, static_cast<int64_t>(full.nbytes()));
    } catch (const std::invalid_argument& error) {
      return error.what();
    }
    return "";
  };
  EXPECT_EQ(error_of(3, at::zeros({4})),
            "dp_shard: reduce_scatter_sum needs dim 0 divisible by the group size 3");
  EXPECT_EQ(error_of(2, at::zeros({})),
            "dp_shard: reduce_scatter_sum needs dim 0 divisible by the group size 2");
  EXPECT_EQ(error_of(2, at::zeros({4}, at::kBFloat16)),
            "dp_shard: reduce_scatter_sum of BFloat16 is not offered; reduce in float32");
  EXPECT_EQ(error_of(2, at::zeros({4}, at::kByte)),
            "dp_shard: reduce_scatter_sum of Byte is not offered; reduce in float32");
}

// Every rank of 4 with its own counts: the result rows are what it receives, the bytes what it
// sends to the others (its own block stays).
TEST(CollectiveChecks, AllToAllForEveryRankOfFour) {
  // send[i][j]: rows rank i sends to rank j (rows of 3 float32: 12 bytes).
  const int64_t send[4][4] = {{1, 0, 2, 3}, {0, 4, 1, 1}, {2, 2, 0, 0}, {1, 1, 1, 1}};
  for (int i = 0; i < 4; ++i) {
    std::vector<int64_t> out(send[i], send[i] + 4), in;
    int64_t rows = 0, received = 0, sent = 0;
    for (int j = 0; j < 4; ++j) {
      rows += send[i][j];
      in.push_back(send[j][i]);
      received += send[j][i];
      if (j != i) sent += send[i][j];
    }
    const AllToAllShape shape = check_all_to_all("ep", i, 4, at::zeros({rows, 3}), out, in);
    EXPECT_EQ(shape.result, (std::vector<int64_t>{received, 3})) << "rank " << i;
    EXPECT_EQ(shape.sent_bytes, sent * 12) << "rank " << i;
  }
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
