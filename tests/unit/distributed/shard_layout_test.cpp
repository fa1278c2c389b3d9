// chunk_layout is torch.chunk's row split; pad_rows pads with zero rows to the wire shape.
#include "mixtrain/distributed/shard_layout.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <utility>
#include <vector>

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(ShardLayout, ChunkLayoutIsTorchChunk) {
  // torch.chunk(10 rows, 4) -> 3, 3, 3, 1; (3 rows, 4) -> 1, 1, 1, 0; (1 row, 2) -> 1, 0.
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> cases = {
      {10, {3, 3, 3, 1}}, {3, {1, 1, 1, 0}}, {1, {1, 0}}, {8, {4, 4}}};
  for (const auto& [rows, expected] : cases) {
    int64_t offset = 0;
    for (size_t r = 0; r < expected.size(); ++r) {
      const auto l = chunk_layout({rows, 5}, static_cast<int64_t>(expected.size()), r);
      EXPECT_EQ(l.rows, expected[r]) << rows << " rank " << r;
      EXPECT_EQ(l.offset, offset) << rows << " rank " << r;
      EXPECT_EQ(l.chunk_rows, expected[0]);
      offset += l.rows;
    }
    EXPECT_EQ(offset, rows);
  }
  EXPECT_THROW(chunk_layout({}, 2, 0), std::invalid_argument);
}

TEST(ShardLayout, PadRowsAppendsZeroRows) {
  const at::Tensor local = at::arange(6, at::kFloat).reshape({2, 3});
  const at::Tensor padded = pad_rows(local, 4);
  ASSERT_EQ(padded.sizes(), (std::vector<int64_t>{4, 3}));
  EXPECT_TRUE(at::equal(padded.narrow(0, 0, 2), local));
  EXPECT_TRUE(at::equal(padded.narrow(0, 2, 2), at::zeros({2, 3})));
  // Already the wire shape: the tensor itself (made contiguous), no copy.
  EXPECT_TRUE(pad_rows(local, 2).is_same(local));
  EXPECT_TRUE(pad_rows(local.t(), 3).is_contiguous());
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
