// The synthetic stream: shapes, label shift, value range, determinism, seek, and that it is
// learnable (its empirical next-token entropy, measured here, is far below ln(vocab)).
#include "mixtrain/data/synthetic_dataset.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

TEST(SyntheticDatasetTest, ShapesDtypeAndRange) {
  SyntheticDataset data(512, 1, 0, 1);
  const Batch batch = data.next_batch(3, 16);
  EXPECT_EQ(batch.input_ids.sizes(), (at::IntArrayRef{3, 16}));
  EXPECT_EQ(batch.labels.sizes(), (at::IntArrayRef{3, 16}));
  EXPECT_EQ(batch.input_ids.scalar_type(), at::kLong);
  EXPECT_EQ(batch.labels.scalar_type(), at::kLong);
  EXPECT_GE(batch.input_ids.min().item<int64_t>(), 0);
  EXPECT_LT(batch.input_ids.max().item<int64_t>(), 512);
  EXPECT_LT(batch.labels.max().item<int64_t>(), 512);
}

TEST(SyntheticDatasetTest, LabelsAreInputsShiftedByOne) {
  SyntheticDataset data(100, 2, 0, 1);
  const Batch batch = data.next_batch(4, 10);
  EXPECT_TRUE(at::equal(batch.labels.narrow(1, 0, 9), batch.input_ids.narrow(1, 1, 9)));
  // Each row is one window: inputs are its first seq_len tokens, labels its last seq_len.
  for (int64_t r = 0; r < 4; ++r) {
    const auto w = data.window(r, 10);
    for (int64_t i = 0; i < 10; ++i) {
      EXPECT_EQ(batch.input_ids[r][i].item<int64_t>(), w[static_cast<size_t>(i)]);
      EXPECT_EQ(batch.labels[r][i].item<int64_t>(), w[static_cast<size_t>(i + 1)]);
    }
  }
}

TEST(SyntheticDatasetTest, SameSeedSameBatchesOtherSeedOtherBatches) {
  SyntheticDataset a(256, 42, 0, 1), b(256, 42, 0, 1), c(256, 43, 0, 1);
  for (int step = 0; step < 3; ++step) {
    const Batch ba = a.next_batch(2, 32);
    const Batch bb = b.next_batch(2, 32);
    const Batch bc = c.next_batch(2, 32);
    EXPECT_TRUE(at::equal(ba.input_ids, bb.input_ids));
    EXPECT_TRUE(at::equal(ba.labels, bb.labels));
    EXPECT_FALSE(at::equal(ba.input_ids, bc.input_ids));
  }
}

TEST(SyntheticDatasetTest, SeekReproducesTheStream) {
  SyntheticDataset data(256, 5, 0, 1);
  data.next_batch(2, 8);
  const int64_t mark = data.position();
  EXPECT_EQ(mark, 2);
  const Batch second = data.next_batch(2, 8);
  const Batch third = data.next_batch(2, 8);
  data.seek(mark);
  EXPECT_TRUE(at::equal(data.next_batch(2, 8).input_ids, second.input_ids));
  EXPECT_TRUE(at::equal(data.next_batch(2, 8).input_ids, third.input_ids));
  // A fresh dataset seeked to the mark continues identically too (checkpoint resume).
  SyntheticDataset resumed(256, 5, 0, 1);
  resumed.seek(mark);
  EXPECT_TRUE(at::equal(resumed.next_batch(2, 8).labels, second.labels));
}

TEST(SyntheticDatasetTest, StreamIsLearnable) {
  const int64_t vocab = 512;
  SyntheticDataset data(vocab, 1234, 0, 1);
  // Count transitions (a -> b) over 64 windows of 512 tokens (32768 pairs, ~64 per token).
  std::map<int64_t, std::map<int64_t, int64_t>> counts;
  int64_t pairs = 0;
  for (int64_t w = 0; w < 64; ++w) {
    const auto tokens = data.window(w, 512);
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      ++counts[tokens[i]][tokens[i + 1]];
      ++pairs;
    }
  }
  // Empirical conditional entropy H(next | current) = -sum p(a, b) log p(b | a), in nats.
  double entropy = 0.0;
  size_t most_successors = 0;
  for (const auto& [a, next] : counts) {
    int64_t total = 0;
    for (const auto& [b, n] : next) total += n;
    for (const auto& [b, n] : next) {
      entropy -= static_cast<double>(n) / pairs * std::log(static_cast<double>(n) / total);
    }
    most_successors = std::max(most_successors, next.size());
  }
  // Uniform tokens would give ln(512) = 6.24 nats; 0.5 * 0.69 + 0.25 * 1.39 + 0.15 * 1.90 +
  // 0.1 * 2.30 = 1.21 nats is the chain's rate. The plug-in estimate is slightly low (~64
  // samples per token), hence the 0.15 margin.
  EXPECT_LT(entropy, 0.25 * std::log(static_cast<double>(vocab)));
  EXPECT_NEAR(entropy, 1.208, 0.15);
  EXPECT_NEAR(data.entropy_rate(), 1.208, 1e-3);
  EXPECT_LE(most_successors, static_cast<size_t>(SyntheticDataset::kSuccessors));
  // Most of the vocabulary is visited: the structure is not a short cycle.
  EXPECT_GT(counts.size(), static_cast<size_t>(vocab / 2));
}

// A vocabulary of one is the class's invariant (validate_test.cpp refuses the config naming
// model.vocab_size as the user wrote it).
TEST(SyntheticDatasetTest, TinyVocabularyWorksAndVocabOfOneIsRefused) {
  SyntheticDataset data(2, 1, 0, 1);
  const Batch batch = data.next_batch(2, 8);
  EXPECT_LT(batch.input_ids.max().item<int64_t>(), 2);
  EXPECT_THROW(SyntheticDataset(1, 1, 0, 1), std::invalid_argument);
}

TEST(SyntheticDatasetTest, DescribeIsOneLine) {
  SyntheticDataset data(512, 9, 1, 2);
  const std::string line = data.describe();
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_NE(line.find("synthetic"), std::string::npos);
  EXPECT_NE(line.find("vocab 512"), std::string::npos);
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
